"""Launch a sharded pytest run over several processes: ``torchrun`` with pytest's exit code.

    python -m pytest_robust.launch --nproc-per-node 2 -m pytest --robust-device cuda tests/

takes exactly ``torchrun``'s arguments (``torch.distributed.run``) and starts the same ranks. The
difference is at the end: when tests fail, torchrun reports the non-zero exit of a rank as a
``ChildFailedError`` traceback and exits 1, whatever pytest said. This launcher exits with rank
0's exit code (pytest's: 1 tests failed, 2 interrupted, 4 usage error, ...) and prints one line
naming the ranks that did not exit 0, so a CI log reads like a plain pytest run.
"""

from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run


def exit_code(err: ChildFailedError) -> int:
    """The exit code to leave with: rank 0's when it failed, else the first failed rank's."""
    failures = err.failures
    first = failures.get(0) or failures[min(failures)]
    return first.exitcode if first.exitcode > 0 else 1


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with ``argv``; pytest's exit code (0 when every rank exited 0)."""
    try:
        run(parse_args(sys.argv[1:] if argv is None else argv))
    except ChildFailedError as err:
        code = exit_code(err)
        ranks = ", ".join(f"rank {r} exit {f.exitcode}" for r, f in sorted(err.failures.items()))
        print(f"pytest_robust.launch: {ranks}; exiting with {code}", file=sys.stderr)
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
