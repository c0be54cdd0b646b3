#!/usr/bin/env python3
"""Render `nacre store bench --format json` output as a markdown table.

Usage: scripts/bench-table.py RUN.json [RUN2.json ...]
With several runs, each test gets one row per run.
"""
import json
import sys


def row(name, run, t):
    s, r = t["store"], t["raw"]
    ratio = s["iops"] / r["iops"] if r["iops"] else 0
    lat = lambda x: f'{x["lat_us"]["avg"]:.0f} / {x["lat_us"]["p50"]:.0f} / {x["lat_us"]["p99"]:.0f}'
    mbs = lambda x: f'{x["mib_s"]:.0f}'
    return (f'| {name} | {run} | {s["iops"]:.0f} | {r["iops"]:.0f} | **{ratio:.2f}** | {mbs(s)} / {mbs(r)} | '
            f'{lat(s)} | {lat(r)} | {s["cpu_us_per_op"]:.1f} / {r["cpu_us_per_op"]:.1f} |')


def main(paths):
    runs = [json.load(open(p)) for p in paths]
    print("| test | run | store IOPS | raw IOPS | store/raw | MiB/s store / raw | store µs avg / p50 / p99 "
          "| raw µs avg / p50 / p99 | CPU µs/op store / raw |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for i, name in enumerate(t["name"] for t in runs[0]["tests"]):
        for n, r in enumerate(runs, 1):
            print(row(name if n == 1 else "", n, r["tests"][i]))
    m = runs[-1]["memory"]
    print()
    print(f'Index: {m["objects"]} objects, {m["index_bytes_per_object"]:.1f} bytes/object, '
          f'{m["index_mib_per_tib"]:.0f} MiB per TiB of data; checksum cache {m["csum_cache_bytes"] >> 10} KiB.')


if __name__ == "__main__":
    main(sys.argv[1:])
