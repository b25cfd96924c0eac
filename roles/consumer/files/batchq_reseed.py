# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A preloaded batch's random state is its own. Part of batchq-drain,
installed beside it.

Each batch is a fork of the runner (batchq_preload.py): without a reseed,
every batch would draw the same numbers from the generators the preloaded
modules made. The fork reseeds random's global generator (CPython's own
at-fork hook). The batch reseeds from the system's entropy what the runner
found once after the preload (find()): every random.Random (not SystemRandom,
which keeps no state) and numpy Generator and RandomState that is a global of
a loaded module, and numpy's global generator (numpy.random.seed()) once
numpy.random is loaded. A generator kept elsewhere (in a class, a closure, a
list, another library's C state) is reseeded by its module itself, with
os.register_at_fork(after_in_child=...).
"""

import sys
import types

# What a forked batch reseeds (reseed()): found once after the preload (find()).
RESEED = []


def find():
    """Find, once per run, the random generators that each forked batch must reseed (RESEED)."""
    RESEED[:] = random_generators()


def random_generators():
    """The random generators that a forked batch must reseed, each as a
    function that reseeds it from the system's entropy: every random.Random
    (not SystemRandom: it keeps no state) and numpy Generator and RandomState
    that is a global of a loaded module, and numpy's global generator. Only
    the modules' own globals are looked at, once per run: a generator kept
    deeper is its module's to reseed (os.register_at_fork)."""
    random_module = sys.modules.get("random")
    numpy_random = sys.modules.get("numpy.random")
    kinds = []
    if random_module is not None:
        kinds.append((random_module.Random, random_module.SystemRandom, lambda found: found.seed))
    if numpy_random is not None:
        kinds.append((getattr(numpy_random, "RandomState", ()), (), lambda found: found.seed))
        kinds.append((getattr(numpy_random, "Generator", ()), (), lambda found: lambda: reseed_numpy_generator(found)))
    found = {}
    for module in list(sys.modules.values()):
        if not isinstance(module, types.ModuleType):
            continue
        try:
            # not module.__dict__: a lazy module (importlib.util.LazyLoader) would import itself
            values = list(object.__getattribute__(module, "__dict__").values())
        except (AttributeError, TypeError):
            continue
        for value in values:
            # type(), not isinstance(): a proxy's __class__ may run code
            kind = type(value)
            for wanted, unwanted, reseeder in kinds:
                if issubclass(kind, wanted) and not issubclass(kind, unwanted) and id(value) not in found:
                    found[id(value)] = (value, reseeder(value))
    reseeders = [reseeder for _value, reseeder in found.values()]
    if numpy_random is not None and hasattr(numpy_random, "seed"):
        reseeders.append(numpy_random.seed)
    return reseeders


def reseed_numpy_generator(generator):
    """A numpy Generator has no seed(): its bit generator takes the state of a
    new one of its kind, seeded from the system's entropy."""
    bits = generator.bit_generator
    bits.state = type(bits)().state


def reseed():
    """In a forked batch: reseed what find() found."""
    for reseeder in RESEED:
        try:
            reseeder()
        except Exception as exc:  # pylint: disable=broad-except
            sys.stderr.write("batchq-drain: a random generator of the preload is not reseeded: %s: %s\n"
                             % (type(exc).__name__, exc))
