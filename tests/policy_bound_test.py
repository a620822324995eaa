#!/usr/bin/env python3
"""Tests of lab/studies/policy_bound.py (the per-class holding-time bound of docs/policy-study.md
section 5) on traces small enough to work out by hand, and its refusals of bad input."""

import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lab", "studies"))
import policy_bound  # noqa: E402


def run(lines, *flags):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
        path = f.name
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            rc = policy_bound.main(["--trace", path, "--json", *flags])
    finally:
        os.unlink(path)
    return rc, (json.loads(out.getvalue()) if rc == 0 else None), err.getvalue()


def req(*ids, ts=0, out=10):
    return {"timestamp": ts, "output_length": out, "hash_ids": list(ids)}


class BoundByHand(unittest.TestCase):
    # Requests [1], [2], [1], [2]: 4 references, blocks 1 and 2 each reused once after 2
    # requests, so the unbounded hit ratio is 2/4. Capacity 1 block (fraction 0.5 of 2 distinct)
    # gives a space-time budget of 1 x 4 requests.
    TRACE = [req(1), req(2), req(1), req(2)]

    def test_one_class_must_share_the_budget(self):
        # One class, intervals 2, 2, never, never: holding 2 ticks keeps both reuses but costs
        # 2+2+2+2 = 8 > 4, so at best half of that (a randomized holding time): 1 reuse = 0.25.
        rc, r, _ = run(self.TRACE, "--fractions", "0.5", "--features", "none")
        self.assertEqual(rc, 0)
        self.assertAlmostEqual(r["unbounded_hit_ratio"], 0.5)
        self.assertEqual(r["bounds"][0]["capacity_blocks"], 1)
        self.assertAlmostEqual(r["bounds"][0]["bound_hit_ratio"], 0.25, places=4)

    def test_use_count_tells_the_dead_references_apart(self):
        # Class u=1 (intervals 2, 2) held 2 ticks costs 4 = the budget; class u=2 (never reused)
        # is not held: both reuses kept, the unbounded ratio.
        rc, r, _ = run(self.TRACE, "--fractions", "0.5", "--features", "u")
        self.assertEqual(rc, 0)
        self.assertAlmostEqual(r["bounds"][0]["bound_hit_ratio"], 0.5, places=4)
        self.assertAlmostEqual(r["bounds"][0]["ratio_to_unbounded"], 1.0, places=4)

    def test_more_features_and_more_capacity_never_lower_the_bound(self):
        trace = []
        for k in range(40):
            trace.append(req(0, 100 + k, ts=k * 1000, out=k % 7))
            trace.append(req(*range(1000 + 10 * k, 1008 + 10 * k), ts=k * 1000 + 1, out=50))
            if k >= 5:
                trace.append(req(0, 100 + k - 5, 5000 + k, ts=k * 1000 + 2))
        rc, r, _ = run(trace, "--fractions", "0.02,0.05,0.2", "--features",
                       "none;u;u,last;u,last,nb;u,last,nb,turn", "--no-placebo")
        self.assertEqual(rc, 0)
        by = {}
        for row in r["bounds"]:
            by[(row["features"], row["fraction"])] = row["bound_hit_ratio"]
            self.assertLessEqual(row["bound_hit_ratio"], r["unbounded_hit_ratio"] + 1e-9)
        sets = ["none", "u", "u,last", "u,last,nb", "u,last,nb,turn"]
        for f in (0.02, 0.05, 0.2):
            for a, b in zip(sets, sets[1:]):
                self.assertLessEqual(by[(a, f)], by[(b, f)] + 1e-9, (a, b, f))
        for s in sets:
            self.assertLessEqual(by[(s, 0.02)], by[(s, 0.05)] + 1e-9)
            self.assertLessEqual(by[(s, 0.05)], by[(s, 0.2)] + 1e-9)
        # Short requests (2 blocks) are the reused ones: request length alone separates them.
        self.assertGreater(by[("u,last,nb", 0.05)], by[("none", 0.05)] + 0.01)

    def test_placebo_rows_are_reported_for_out_and_pg(self):
        rc, r, _ = run(self.TRACE + [req(3, out=5)], "--fractions", "0.5", "--features", "u,out")
        self.assertEqual(rc, 0)
        self.assertEqual([row["placebo"] for row in r["bounds"]], [False, True])


class BadInput(unittest.TestCase):
    def test_negative_id_names_line_and_field(self):
        rc, _, err = run([req(1), '{"hash_ids": [3, -1]}'])
        self.assertEqual(rc, 2)
        self.assertIn("line 2", err)
        self.assertIn("hash_ids[1]", err)

    def test_not_json_names_the_line(self):
        rc, _, err = run([req(1), req(2), "{hash_ids: oops"])
        self.assertEqual(rc, 2)
        self.assertIn("line 3", err)

    def test_bad_timestamp_and_empty_ids(self):
        self.assertEqual(run(['{"timestamp": -5, "hash_ids": [1]}'])[0], 2)
        rc, _, err = run(['{"hash_ids": []}'])
        self.assertEqual(rc, 2)
        self.assertIn("non-empty", err)

    def test_unknown_feature_and_bad_fraction(self):
        rc, _, err = run([req(1)], "--features", "u,colour")
        self.assertEqual(rc, 2)
        self.assertIn("colour", err)
        rc, _, err = run([req(1)], "--fractions", "1.5")
        self.assertEqual(rc, 2)
        self.assertIn("(0, 1]", err)

    def test_missing_file(self):
        err = io.StringIO()
        with redirect_stderr(err):
            rc = policy_bound.main(["--trace", "/nonexistent/trace.jsonl"])
        self.assertEqual(rc, 2)
        self.assertIn("cannot open", err.getvalue())


if __name__ == "__main__":
    unittest.main()
