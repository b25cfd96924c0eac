-- The job table of the reference consumer (batchq-pgqueue). Applied by
-- database.yml; safe to apply again.
CREATE TABLE IF NOT EXISTS batchq_jobs (
    id          bigserial PRIMARY KEY,
    queue       text NOT NULL DEFAULT 'default',
    payload     jsonb NOT NULL,
    state       text NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'done', 'dead')),
    -- failed attempts; a batch that dies rolls back and counts none
    attempts    integer NOT NULL DEFAULT 0,
    last_error  text,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    done_at     timestamptz,
    -- host/consumer@instance/invocation#batch of the batch that did it
    done_by     text
);

-- Consumers take the oldest queued jobs of their queue: only those are indexed.
CREATE INDEX IF NOT EXISTS batchq_jobs_queued ON batchq_jobs (queue, id) WHERE state = 'queued';

-- What processing a job produces. Written in the transaction that claims the
-- job and marks it done, so it is applied exactly once. No unique key on
-- job_id on purpose: a result applied twice would show as a second row (the
-- fleet test counts them); a table of your own may well have one.
CREATE TABLE IF NOT EXISTS batchq_results (
    job_id     bigint NOT NULL REFERENCES batchq_jobs (id),
    result     text NOT NULL,
    applied_by text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS batchq_results_job ON batchq_results (job_id);
