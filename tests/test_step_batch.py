"""smolforge.step_batch between commands: the last command's garbage freed, the survivors frozen."""
from __future__ import annotations

import gc
import weakref

from smolforge.step_batch import release_memory


class Node:
    """A reference cycle's member, as a trainer and its callbacks are."""


def cycle() -> weakref.ref:
    first, second = Node(), Node()
    first.other, second.other = second, first
    return weakref.ref(first)


def test_release_memory_frees_the_last_commands_cycles_then_freezes_what_survived():
    previous_command = cycle()                 # unreachable, kept alive only by its cycle
    survivor = Node()
    frozen = gc.get_freeze_count()
    release_memory()
    assert previous_command() is None          # collected before the freeze, not frozen with the rest
    assert gc.get_freeze_count() > frozen      # the survivors left the collector's reach
    assert gc.is_tracked(survivor) and all(o is not survivor for o in gc.get_objects())   # frozen: in no generation
    next_command = cycle()                     # what the next command leaves is collected as usual
    gc.collect()
    assert next_command() is None
