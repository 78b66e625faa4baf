"""The screen recommends a prevention only where rksp's own benchmark measured that it helps."""

from rksp_cli.risk.preventions import advice, helpful


def _arm(arm, diverged, p=1.0, time_ratio=1.0, runs=24, accuracy=0.9, se=0.01):
    return {"arm": arm, "runs": runs, "diverged": diverged, "fisher_p": p, "time_ratio": time_ratio,
            "final_accuracy": accuracy, "final_accuracy_se": se}  # fmt: skip


MEASURED = {
    "families": {
        "none": [
            _arm("baseline", 14),
            _arm("KSS alpha 0.10", 19, p=0.2),  # worse
            _arm("clip 1.0", 2, p=0.0004),
            _arm("clip 0.5", 1, p=0.0001, time_ratio=1.3),  # better, but too slow for the bar
            _arm("qk-layernorm", 8, p=0.15),  # fewer, but neither half nor significant
            _arm("z-loss 1e-4", 1, p=0.0001, accuracy=0.8),  # survives, but learns less (0.1 > 2 SE)
        ]
    }
}


def test_only_arms_that_halve_divergence_significantly_and_cheaply_pass():
    assert [r["arm"] for r in helpful(MEASURED["families"]["none"])] == ["clip 1.0"]


def test_advice_names_the_measured_effect_or_says_nothing_was_shown():
    text = advice("none", MEASURED)
    assert "clip 1.0" in text and "2/24" in text and "14/24" in text and "KSS" not in text
    assert "also passed" not in text  # one arm passed
    sigma = _arm("sigmaReparam", 0, p=1e-8) | {"changes": {"model.sigma_reparam": True}}
    text = advice("none", {"families": {"none": [*MEASURED["families"]["none"], sigma]}})
    assert "use sigmaReparam (model.sigma_reparam: true):" in text  # how to switch it on
    text = advice("none", {"families": {"none": [*MEASURED["families"]["none"], sigma]}}, builtin=False)
    assert "use sigmaReparam:" in text  # a transformers model has no model.sigma_reparam field
    assert text.index("sigmaReparam") < text.index("clip 1.0 also passed (2/24)")  # the best first, then the rest
    caveat = "no arm learned the task in 1000 steps"
    assert "caveat" not in text
    with_caveat = advice("none", {"families": {"none": [*MEASURED["families"]["none"], sigma]}, "caveat": caveat})
    assert with_caveat.endswith(f"; caveat: {caveat}")  # the benchmark's own limits travel with its advice
    failing = {"families": {"none": [_arm("baseline", 14), _arm("KSS alpha 0.10", 19, p=0.2)]}}
    assert "no prevention halved divergence" in advice("none", failing)
    assert "tried: KSS alpha 0.10;" in advice("none", failing)  # names what was measured, nothing more
    assert "no prevention has been measured for models with norm 'pre'" in advice("pre", MEASURED)
    assert "models of this architecture" in advice(None, MEASURED)
    assert advice("none", {}).startswith("lower the learning rate")


def test_an_alarm_driven_arm_passes_only_if_it_left_the_clean_runs_alone():
    guard = {"changes": {"training.guard": "backoff"}}
    rows = [_arm("baseline", 14), _arm("back-off", 0, p=1e-8) | guard]
    assert helpful(rows) == []  # its controls were never measured
    touched = rows[1] | {"controls": {"runs": 4, "diverged": 0, "guard_acted": 3}}
    assert helpful([rows[0], touched]) == []  # it cut the lr of runs that needed no help
    untouched = rows[1] | {"controls": {"runs": 4, "diverged": 0, "guard_acted": 0}}
    assert [r["arm"] for r in helpful([rows[0], untouched])] == ["back-off"]


def test_an_arm_that_learns_less_over_the_longer_check_does_not_pass():
    def learned(accuracy, se):
        return {"learning": {"final_accuracy": accuracy, "final_accuracy_se": se}}

    base = _arm("baseline", 19) | learned(0.064, 0.018)
    slow = _arm("sigmaReparam", 0, p=1e-8) | learned(0.008, 0.008)  # 0.056 below, 2 SE of the difference 0.039
    fine = _arm("clip 1.0", 3, p=1e-5) | learned(0.05, 0.02)
    unchecked = _arm("clip 0.5", 4, p=1e-4)  # no learning check: judged on the arms' own runs
    assert [r["arm"] for r in helpful([base, slow, fine, unchecked])] == ["clip 1.0", "clip 0.5"]
    assert [r["arm"] for r in helpful([_arm("baseline", 19), slow])] == ["sigmaReparam"]  # baseline unchecked
