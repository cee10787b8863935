"""stepscope next to HTA 0.5 on a set of real Kineto traces, point by point: kernel counts
and totals, memcpy/memset counts, bytes and time, the temporal breakdown, idle time per
stream by category, each launch's delay and CPU time, host sync calls, per-step kernel
time. Each trace is reported as agrees / explained (differs only where HTA's documented
bugs, applied to stepscope's input, give HTA's numbers exactly) / differs / hta failed.

    python bench/bench_hta_agreement.py                      # the committed fixtures
    python bench/bench_hta_agreement.py --traces DIR -v      # any folder of *.json(.gz) traces, with the differing points

The comparison itself is stepscope.testing.hta_agreement (also run by the tests);
docs/traces.md lists HTA's bugs."""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "packages/core/tests/fixtures/traces"


def _agreement():  # type: ignore[no-untyped-def]
    from stepscope.testing import hta_agreement

    return hta_agreement


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, default=FIXTURES, help="a folder of Kineto traces (searched recursively)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the differing points")
    args = parser.parse_args()
    agreement = _agreement()
    paths = sorted(p for p in args.traces.rglob("*") if p.name.endswith((".json", ".json.gz")) and p.is_file())
    results = []
    for path in paths:
        started = time.perf_counter()
        result = agreement.compare(path)
        results.append(result)
        kinds = Counter(p.analysis for p in result.differing())
        print(f"{result.status:10s} {len(result.points):6d} points ({result.count('agrees')} agree, {result.count('explained')} explained, {result.count('differs')} differ) "
              f"{time.perf_counter() - started:5.1f} s  {path.relative_to(args.traces)}  {dict(kinds) if kinds else ''}{result.error}", flush=True)
        if args.verbose:
            for point in result.differing()[:10]:
                print(f"    {point}")
    summary = agreement.summary(results)
    print("summary:", summary)
    good = summary.get("agrees", 0) + summary.get("explained", 0)
    print(f"{good} of {summary['traces']} traces agree with HTA 0.5 or differ only by its documented bugs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
