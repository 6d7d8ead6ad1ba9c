"""The README's commands are the ones CI runs, its script parses, every example is tested."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _blocks(lang: str, text: str = README) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def _section(title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, flags=re.S | re.M)
    assert m, f"README has no '## {title}' section"
    return m.group(1)


def test_readme_opens_with_a_two_command_quickstart() -> None:
    assert README.split("\n## ")[1].startswith("Quickstart")
    commands = [line for line in _blocks("bash", _section("Quickstart"))[0].splitlines() if line]
    assert len(commands) == 2
    install_demo, install_test = commands
    assert install_demo.startswith("pip install torch==") and "splitsync run -n 2 examples/digits.py" in install_demo
    assert "python -m pytest" in install_test


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    test_command = [line for line in _blocks("bash", _section("Quickstart"))[0].splitlines() if line][1]
    ci_lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert test_command in ci_lines
    assert "splitsync check examples/" in ci_lines
    assert test_command in _blocks("bash", _section("Tests"))[0]


def test_readme_user_script_is_valid_python_of_fifteen_lines() -> None:
    script = _blocks("python", _section("The user's script"))[0]
    ast.parse(script)
    assert len([line for line in script.splitlines() if line.strip()]) == 15


def test_every_example_is_launched_by_a_test() -> None:
    tests = "".join(p.read_text(encoding="utf-8")
                    for p in (ROOT / "tests" / "launcher").glob("test_examples_*.py")
                    if p.name != Path(__file__).name)
    examples = [p for p in (ROOT / "examples").rglob("*.py") if p.name != "simplenet.py"]
    assert examples
    untested = [str(p.relative_to(ROOT)) for p in examples if p.name not in tests]
    assert not untested, f"examples no test runs: {untested}"


def test_feature_table_names_hsdp_offload_checkpointing_ema_and_the_memory_planner() -> None:
    table = _section("Features")
    names = ['strategy="hsdp"', "replicate=", "shard=", "offload=True",
             "activation_checkpointing=", "run.ema(model, decay=", "run.export(path, model=ema)",
             "splitsync plan --memory", "--model", "--batch-size", "--input-shape",
             "--optimizer", "--strategies", "+offload", "+act-ckpt", "--sizes", "--memory-gb",
             "--json", "`strategy`", "`devices`", "`params_bytes`", "`grads_bytes`",
             "`optimizer_bytes`", "`activations_bytes`", "`peak_bytes`"]
    missing = [n for n in names if n not in table]
    assert not missing, f"the README's feature table does not name {missing}"


def test_the_suite_leaves_the_extended_trials_to_ci_which_runs_them_after_it() -> None:
    import tomllib

    pytest_ini = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))[
        "tool"]["pytest"]["ini_options"]
    assert ("extended: longer trials that .ci/run runs after the README's test command"
            in pytest_ini["markers"])
    assert pytest_ini["addopts"] == ["-m", "not extended", "-n", "2", "--dist", "loadgroup"]
    ci_lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    readme_command = [line for line in _blocks("bash", _section("Quickstart"))[0].splitlines()
                      if line][1]
    extended = "OMP_NUM_THREADS=1 python -m pytest -q -m extended"
    assert ci_lines.index(extended) > ci_lines.index(readme_command)
    assert extended in _section("Tests") and '-m "not slow"' in _section("Tests")


@pytest.mark.slow  # collects in another interpreter
def test_an_extended_trial_runs_only_under_its_marker_and_is_slow_too() -> None:
    def collected(*marker: str) -> set[str]:
        out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0",
                              "-p", "no:cacheprovider", *marker,
                              "tests/launcher/test_resume_rng.py"],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
        return {line.split("::")[-1] for line in out.stdout.splitlines() if "::" in line}

    every = {f"test_every_global_generator_is_as_uninterrupted_at_the_first_step_after_a_resume"
             f"[{n}]" for n in (1, 2)}
    suite = collected()  # the default -m leaves the extended cases out
    extended = collected("-m", "extended and slow")  # so "-m 'not slow'" leaves them out too
    assert suite and extended and suite | extended == every and not suite & extended
