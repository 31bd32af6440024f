"""Time `manage.py loadpolicies` on the demo fixture and on a large generated document.

Each round runs in a fresh process on a fresh SQLite database (migrated first, not timed),
and times, through the command itself (`call_command`, as an operator runs it):
- demo: the demo fixture into an empty store;
- large: a generated document (tiers, hundreds of tenants, half with overrides) over it;
- large, changed: the same document with every override and one rule of each tier changed;
- large, same: the changed document again (nothing to write).
It also counts the SQL queries of each load. Python's garbage collector runs a full collection
before each timed load.

With `--against TREE` (another checkout of the project, e.g. main before a change), the
rounds alternate between the two trees in one run, so that both see the same machine load;
the table gives each tree's median and the ratio.

Run: .venv/bin/python bench/loadpolicies.py [--against /work/main] [--rounds 5] [--tenants 400]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
CASES = ("demo", "large", "large, changed", "large, same")


def large_document(tenants: int, changed: bool) -> dict:
    """Tiers of four rules, `tenants` tenants of which every other one has two overrides,
    five global rules; `changed` moves every override and one rule of each tier."""
    bump = 7 if changed else 0
    levels = [{"name": "user", "fail_mode": "open"}, {"name": "team", "fail_mode": "open"}]
    levels.append({"name": "global", "fail_mode": "local", "fallback_fraction": 0.25})
    tiers = {
        f"tier{t:02}": {
            "user": [
                {"type": "token_bucket", "capacity": 10 + t + bump, "per_second": 1},
                {"type": "sliding_window", "limit": 600 + t, "window": 60, "label": "RPM_LIMIT"},
            ],
            "team": [
                {"type": "token_bucket", "capacity": 1000 + t, "per_second": 100},
                {"type": "concurrency", "limit": 10 + t, "lease": 60},
            ],
        }
        for t in range(20)
    }
    doc_tenants: dict = {}
    for i in range(tenants):
        tenant: dict = {"tier": f"tier{i % 20:02}"}
        if i % 2:
            tenant["overrides"] = {
                "team": [
                    {"type": "token_bucket", "capacity": 5000 + i + bump, "per_second": 500},
                    {"type": "gcra", "rate": 50 + i, "burst": 200},
                ]
            }
            tenant["overrides_until"] = "2030-01-01T00:00:00Z"
        doc_tenants[f"tenant-{i:04}"] = tenant
    return {
        "default_tier": "tier00",
        "levels": levels,
        "tiers": tiers,
        "global": [{"type": "token_bucket", "capacity": 100000 + g, "per_second": 10000} for g in range(5)],
        "tenants": doc_tenants,
        "priorities": {"interactive": {"watermark": 0.0}, "batch": {"watermark": 0.2, "levels": ["global"]}},
    }


def worker(tenants: int) -> None:
    """One round in this process: prints {case: [seconds, queries]} as JSON."""
    # This script's folder holds bench/http.py, which would shadow the standard library's.
    sys.path[:] = [os.getcwd(), *(p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent)]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "limiter_admin.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    call_command("migrate", verbosity=0)
    folder = Path(tempfile.mkdtemp(prefix="bench-load-"))
    files = {
        "demo": Path(os.getcwd()) / "policies" / "fixtures" / "demo.yaml",
        "large": folder / "large.json",
        "large, changed": folder / "changed.json",
        "large, same": folder / "changed.json",
    }
    files["large"].write_text(json.dumps(large_document(tenants, changed=False)))
    files["large, changed"].write_text(json.dumps(large_document(tenants, changed=True)))
    out = {}
    for case in CASES:
        # A full collection first, so that none falls inside a timed load by chance: where one
        # lands depends on every allocation before it, which differs between trees.
        gc.collect()
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            call_command("loadpolicies", str(files[case]), stdout=open(os.devnull, "w"))
            out[case] = [time.perf_counter() - started, len(queries)]
    print(json.dumps(out))


def one_round(tree: Path, tenants: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-load-db-") as folder:
        env = {**os.environ, "DATABASE_URL": f"sqlite:///{folder}/db.sqlite3", "REDIS_URL": ""}
        env.pop("REDIS_URL")
        answer = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--worker", "--tenants", str(tenants)],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    return json.loads(answer.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", type=Path, help="another checkout, timed in alternate rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tenants", type=int, default=400)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.tenants)
        return
    trees = {"this tree": HERE} | ({"against": args.against.resolve()} if args.against else {})
    results: dict[str, list[dict]] = {name: [] for name in trees}
    for round_ in range(args.rounds):
        for name, tree in trees.items() if round_ % 2 == 0 else reversed(trees.items()):
            results[name].append(one_round(tree, args.tenants))
            print(f"round {round_ + 1} {name}: {results[name][-1]}", file=sys.stderr)
    print(f"{args.rounds} rounds, {args.tenants} tenants; median seconds (queries):")
    header = "| load | " + " | ".join(trees) + (" | this / against |" if args.against else " |")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for case in CASES:
        cells, medians = [], []
        for name in trees:
            seconds = statistics.median(r[case][0] for r in results[name])
            queries = results[name][0][case][1]
            medians.append(seconds)
            cells.append(f"{seconds * 1000:,.0f} ms ({queries:,})")
        ratio = f" | {medians[0] / medians[1]:.2f} |" if args.against else " |"
        print(f"| {case} | " + " | ".join(cells) + ratio)


if __name__ == "__main__":
    main()
