-- The job table of the reference consumer (batchq-pgqueue). Applied by
-- database.yml; safe to apply again while consumers run: it changes only
-- what is missing, and upgrades a table of an earlier version in place.
-- Apply it before you deploy a consumer that needs what it adds.
-- A change waits at most 10 s for the consumers' locks, then fails
-- (apply it again), rather than holding every claim up behind it.
SET lock_timeout = '10s';

CREATE TABLE IF NOT EXISTS batchq_jobs (
    id          bigserial PRIMARY KEY,
    queue       text NOT NULL DEFAULT 'default',
    payload     jsonb NOT NULL,
    -- queued -> running (claimed by a batch) -> done, or back to queued after
    -- a failed attempt, or dead after the last one
    state       text NOT NULL DEFAULT 'queued'
                CONSTRAINT batchq_jobs_state_check CHECK (state IN ('queued', 'running', 'done', 'dead')),
    -- attempts, each counted when a batch claims the job, in a commit of its
    -- own: a batch that dies has used its attempts too
    attempts    integer NOT NULL DEFAULT 0,
    last_error  text,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    -- when the job is due: now, or after the backoff of a failed attempt
    run_at      timestamptz NOT NULL DEFAULT now(),
    -- the batch (host/consumer@instance/invocation#batch) that holds it while
    -- running, and since when
    claimed_by  text,
    claimed_at  timestamptz,
    -- the number of the batch's claim lock: the session-level advisory lock
    -- (the oid of batchq_jobs, claim_lock) that the batch's session holds while
    -- it lives; NULL for a job claimed by a consumer of before it
    claim_lock  integer,
    done_at     timestamptz,
    -- the batch that did it
    done_by     text
);

-- The upgrade from the first version (states queued, done and dead only, no
-- run_at nor claims), in one statement, only where it is missing.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'batchq_jobs'::regclass AND attname = 'run_at'
                   AND NOT attisdropped) THEN
        ALTER TABLE batchq_jobs
            ADD COLUMN run_at timestamptz NOT NULL DEFAULT now(),
            ADD COLUMN claimed_by text,
            ADD COLUMN claimed_at timestamptz,
            DROP CONSTRAINT IF EXISTS batchq_jobs_state_check,
            ADD CONSTRAINT batchq_jobs_state_check CHECK (state IN ('queued', 'running', 'done', 'dead'));
        DROP INDEX IF EXISTS batchq_jobs_queued;
        RAISE NOTICE 'batchq_jobs upgraded: run_at, claimed_by, claimed_at, state running';
    END IF;
END $$;

-- The upgrade from the second version (a batch held its jobs by row locks
-- in one transaction), only where it is missing: the claim lock's column.
-- Then deploy the new consumer to every worker.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'batchq_jobs'::regclass AND attname = 'claim_lock'
                   AND NOT attisdropped) THEN
        ALTER TABLE batchq_jobs ADD COLUMN claim_lock integer;
        RAISE NOTICE 'batchq_jobs upgraded: claim_lock';
    END IF;
END $$;

-- A claim takes the due jobs of its queue in order, and jobs still running
-- whose batch is gone; a batch deletes done jobs by age: only those three
-- sets are indexed. (CREATE INDEX IF NOT EXISTS would wait for the table's
-- lock even when the index is there.) On a table of millions of done jobs,
-- the index of done jobs, new in the third version, takes seconds to build,
-- and claims wait for it (a claim gives up after 5 s, and the next batch
-- tries again): add it while the consumers are paused.
DO $$
BEGIN
    IF to_regclass('batchq_jobs_due') IS NULL THEN
        CREATE INDEX batchq_jobs_due ON batchq_jobs (queue, run_at, id) WHERE state = 'queued';
    END IF;
    IF to_regclass('batchq_jobs_running') IS NULL THEN
        CREATE INDEX batchq_jobs_running ON batchq_jobs (queue, claimed_at) WHERE state = 'running';
    END IF;
    IF to_regclass('batchq_jobs_done') IS NULL THEN
        CREATE INDEX batchq_jobs_done ON batchq_jobs (queue, done_at) WHERE state = 'done';
    END IF;
END $$;

-- What processing a job produces. Written in the transaction that marks the
-- job done, and only while the job is still the batch's, so it is applied
-- exactly once. No unique key on job_id on purpose: a result applied twice
-- would show as a second row (the fleet test counts them); a table of your
-- own may well have one.
CREATE TABLE IF NOT EXISTS batchq_results (
    job_id     bigint NOT NULL REFERENCES batchq_jobs (id),
    result     text NOT NULL,
    applied_by text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
DO $$
BEGIN
    IF to_regclass('batchq_results_job') IS NULL THEN
        CREATE INDEX batchq_results_job ON batchq_results (job_id);
    END IF;
END $$;

-- Done jobs are kept for batchq-pgqueue's --keep-done-days (7), then its
-- batches delete them with their results, a chunk at a time. To prune by hand
-- (every queue; here after 7 days; run it again until it deletes nothing):
--   WITH old AS (SELECT id FROM batchq_jobs WHERE state = 'done' AND done_at < now() - interval '7 days'
--                LIMIT 10000 FOR UPDATE SKIP LOCKED),
--        results AS (DELETE FROM batchq_results WHERE job_id IN (SELECT id FROM old))
--   DELETE FROM batchq_jobs WHERE id IN (SELECT id FROM old);
-- Dead jobs stay until you delete them.
