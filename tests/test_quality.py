"""The default run (`bazel run //trainer:gem`, no arguments) learns the planted task.

Bar: on every task the held-out AUC captures at least 25 % of the Bayes-optimal AUC lift
over chance, (auc - 0.5) >= 0.25 * (auc_bayes - 0.5), and on the main task (click) NE < 1,
i.e. better than predicting the base rate. Measured at the time of writing: click AUC 0.706
(Bayes 0.772, 76 % of the lift), conversion 0.601 (Bayes 0.728, 44 %).
"""
from __future__ import annotations

from _run import gem, summary


def test_default_run_clears_the_quality_bar() -> None:
    res = gem("--no-progress")
    assert res.returncode == 0, res.stderr[-3000:]
    s = summary(res.stdout)
    assert s["steps"] == 150 and s["bad_steps"] == 0
    for task, m in s["tasks"].items():
        assert m["auc"] - 0.5 >= 0.25 * (m["auc_bayes"] - 0.5), (task, m)
    assert s["tasks"]["click"]["ne"] < 1.0, s["tasks"]["click"]
    assert "Bayes" in res.stdout  # the per-task lines name the Bayes-optimal values
