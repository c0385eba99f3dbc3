"""The docs say what is true of the tree: README.md and docs/*.md checked as a newcomer follows
them (the checks live in tests/docs_checks.py). Docs drifted where nothing checked them: a renamed
test still cited, a deleted bench still named as current, run logs in a user's guide.

* every ``python -m service...``, ``python bench/X.py`` and ``make TARGET`` command parses with
  its own argparse parser (nothing starts), and its config loads and expands, as ``--dry-run``
  does;
* every ```yaml block loads through the config loader, or says which config it is a fragment
  of (``<!-- fragment: tune_configs/quant.yaml -->`` above the fence) and loads merged into it;
* every cited ``tests/<file>.py::name`` is defined there;
* no history prose: dates, clock times, sessions, stop and issue numbers, commit hashes, who
  ran what;
* every path and ``package.module.name`` in inline backticks exists.

Each check has a test that plants the drift it is for in a temporary markdown file, and one
test per check runs it over the tree's docs (``python tests/docs_checks.py [ROOT]`` prints them
all, for this checkout or another).
"""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from tests.docs_checks import (CHECKS, ROOT, all_problems, check_commands, check_history, check_names,
                               check_paths, check_test_citations, check_yaml, commands, docs, history,
                               is_path, path_exists, resolves)


def _doc(tmp_path, text: str):
    doc = tmp_path / "guide.md"
    doc.write_text(textwrap.dedent(text).lstrip("\n"))
    return doc


def _lines(problems: list[str]) -> list[int]:
    """The doc line numbers the problems are on."""
    return [int(p.split(":")[1]) for p in problems]


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_the_docs_pass(check):
    problems = [p for doc in docs() for p in CHECKS[check](doc, ROOT)]
    assert not problems, f"{len(problems)} {check} problems in README.md, docs/*.md:\n" + "\n".join(problems)


def test_commands_are_found_where_a_user_copies_them(tmp_path):
    doc = _doc(tmp_path, """
        Run `make sweep`, or `.venv/bin/python -m service.sweep smoke`; `python -m service.probe` names the program.

        ```bash
        export MLFLOW_TRACKING_URI=http://HEAD:5000   # a comment: python -m service.sweep nope
        OMP_NUM_THREADS=1 sudo -E .venv/bin/python -m service.sweep tune_configs/quant.yaml \\
            --dry-run
        git clone x && make test
        ray job submit --address http://HEAD:8265 -- python -m service.sweep quant
        python -m service.report <run id> --out /tmp/r
        cat > x.env <<EOF
        python -m service.sweep not_run
        EOF
        ```

        ```
        sweep/    python -m service.sweep (a tree of the layout, not a command)
        ```
        """)
    found = [(n, c.name, c.argv) for n, c in commands(doc.read_text())]
    assert found == [
        (5, "service.sweep", ["tune_configs/quant.yaml", "--dry-run"]),
        (7, "make", ["test"]),
        (8, "service.sweep", ["quant"]),
        (9, "service.report", ["@PLACEHOLDER@", "--out", "/tmp/r"]),
        (1, "make", ["sweep"]),
        (1, "service.sweep", ["smoke"]),
    ]


def test_the_command_check_fails_on_a_broken_command(tmp_path):
    doc = _doc(tmp_path, """
        ```bash
        .venv/bin/python -m service.sweep tune_configs/quant.yaml --dry-run
        .venv/bin/python -m service.sweep quant --resume --dryrun
        python -m service.report quant --out /tmp/r --no-attach
        python -m service.report quant --no-attachment
        python -m service.probe --world-size two
        python -m service.submit quant --address http://HEAD:8265 --storage-path /shared/ray
        python -m service.sweep no_such_preset
        python -m service.sweeper quant
        python -m service.sweep --help
        make sweep
        make swept
        python -m service.report <run id>
        ```
        """)
    problems = check_commands(doc, ROOT)
    assert _lines(problems) == [3, 5, 6, 8, 9, 12], problems
    assert "unrecognized arguments: --dryrun" in problems[0]
    assert "invalid int value: 'two'" in problems[2]
    assert "no such file, and not a preset name" in problems[3]
    assert "no Makefile target swept" in problems[5]


def test_the_command_check_fails_on_a_bench_flag_or_a_test_file_that_is_gone(tmp_path):
    doc = _doc(tmp_path, """
        ```bash
        sudo .venv/bin/python bench/projection.py --world-sizes 2 4 8 --links 0.25 0.5 --repeats 2
        .venv/bin/python bench/overhead.py --rounds 1 --profiles ours warm
        .venv/bin/python bench/overhead.py --rounds 1 --seeds 2
        .venv/bin/python bench/verdicts.py compare adaptive=DIR adaptive_hog=DIR
        .venv/bin/python bench/verdicts.py comapre adaptive=DIR
        .venv/bin/python bench/network.py
        .venv/bin/python -m pytest tests/test_docs_hygiene.py tests/test_no_such_file.py::test_x -q
        python my_train.py --epochs 3
        ```
        """)
    problems = check_commands(doc, ROOT)
    assert _lines(problems) == [4, 6, 7, 8], problems
    assert "invalid choice: 'comapre'" in problems[1] and "no such script bench/network.py" in problems[2]
    assert problems[3].endswith("`python -m pytest tests/test_docs_hygiene.py tests/test_no_such_file.py::test_x -q`: "
                                "no such file tests/test_no_such_file.py")


def test_the_command_check_fails_on_a_config_key_the_loader_refuses(tmp_path):
    config = tmp_path / "mine.yaml"
    config.write_text((ROOT / "tune_configs" / "smoke.yaml").read_text().replace("workload:", "workloads:", 1))
    doc = _doc(tmp_path, f"```bash\npython -m service.submit {config} --address http://HEAD:8265\n```\n")
    problems = check_commands(doc, ROOT)
    assert problems and all(p.startswith(f"{doc}:2: ") for p in problems)
    assert "workloads: unknown key (did you mean 'workload'?)" in problems[0]


def test_the_yaml_check_fails_on_a_renamed_config_key(tmp_path):
    whole = (ROOT / "tune_configs" / "smoke.yaml").read_text()
    doc = _doc(tmp_path, "\n".join([
        "```yaml", whole, "```", "",
        "```yaml", whole.replace("world_size:", "world_sizes:", 1), "```", "",
        "<!-- fragment: tune_configs/quant.yaml -->", "```yaml", "workload:", "  lr: 0.05", "```", "",
        "<!-- fragment: tune_configs/quant.yaml -->", "```yaml", "workload:", "  learning_rate: 0.05", "```", "",
        "```yaml", "# fragment of smoke", "search:", "  hooks:", "    - {name: fp16_compress}", "```", "",
        "```yaml", "workload:", "  lr: 0.05", "```", "",
        "```yaml", "apiVersion: v1", "kind: ConfigMap", "metadata: {name: x}", "```",
    ]))
    problems = check_yaml(doc, ROOT)
    assert len(problems) == 3, problems
    assert "(a config)" in problems[0] and "search.world_sizes: unknown key (did you mean 'world_size'?)" in problems[0]
    assert "merged into tune_configs/quant.yaml" in problems[1] and "learning_rate: unknown key" in problems[1]
    assert "a fragment? say of which config" in problems[2]


def test_the_citation_check_fails_on_a_deleted_test(tmp_path):
    doc = _doc(tmp_path, """
        | fault | test |
        |---|---|
        | NaN loss | `tests/test_nan.py::test_nonfinite_loss_is_reported_as_loss` |
        | NaN loss | `tests/test_nan.py::test_nonfinite_loss_is_reported_as_losses` |
        | renamed file | tests/test_nans.py::test_nonfinite_loss_is_reported_as_loss |
        ```bash
        .venv/bin/python -m pytest tests/test_docs_hygiene.py::test_the_docs_pass[commands] -q
        .venv/bin/python -m pytest tests/test_docs_hygiene.py::test_the_docs_passes[commands] -q
        ```
        """)
    problems = check_test_citations(doc, ROOT)
    assert _lines(problems) == [4, 5, 8], problems
    assert "did you mean test_nonfinite_loss_is_reported_as_loss?" in problems[0]
    assert "no such file" in problems[1]


def test_the_history_check_fails_on_a_dated_run_log(tmp_path):
    doc = _doc(tmp_path, """
        The main job takes 12 min on a 2-core Xeon (`bench/results/main_job_2026-12-05.json`).
        Measured 2026-12-05 14:08–14:30 UTC, load average 0.4.
        Next session (2026-12-03 evening): the suite again.
        Stop 48 (e0e0f1b) passed CI in 1541 s; another engineer's jobs ran beside it.
        ### Issue 33: folders by layer
        W = 2 rows were measured in an earlier session. Next time: rerun at W = 8.
        Ray 2.60.0 keeps its logs in the session directory; the next time you run the sweep, `--resume`.
        Ctrl-C stops 2 workers at once; colours #1f77b4; a run id 3f2a9c1e0b7d4a5e8f6a2b1c0d9e8f7a.
        Pin torch==2.13.0 on a release from Dec 2026? No: from the wheel of 2026-12-01.
        """)
    found = [(n, what) for n, what, _ in history(doc.read_text())]
    assert found == [(2, "a date"), (2, "a clock time"), (3, "a date"), (3, "a session"),
                     (4, "a stop number"), (4, "a commit hash"), (4, "who ran it"), (5, "an issue number"),
                     (6, "a session"), (6, "next time"), (9, "a date"), (9, "a date")]
    assert len(check_history(doc, ROOT)) == len(found)


def test_the_path_check_fails_on_a_deleted_file_even_where_it_says_so(tmp_path):
    doc = _doc(tmp_path, """
        The old model (`bench/network.py`, deleted) and `bench/projection.py`, `hooks/clipped.py`.
        The report writes `transport.json`; benches write `overhead.json` to `bench/results/`.
        Not a file here: `no_such_artifact.json`, `~/.cache/x`, `s3://B/P`, `fp16/bf16_compress`.
        """)
    problems = check_paths(doc, ROOT)
    assert problems == [f"{doc}:1: `bench/network.py`: no such path",
                        f"{doc}:3: `no_such_artifact.json`: no such path"]
    assert not is_path("fp16/bf16_compress") and not is_path("~/.cache/x") and not is_path("s3://B/P")
    assert path_exists("train/ray_entry.py")  # under service/, as architecture.md's layout names it


def test_a_bare_file_name_is_a_repository_file_or_one_the_code_writes(tmp_path):
    """A name the code only mentions (a comment, a docstring, inside a longer string) is no artifact."""
    (tmp_path / "service").mkdir()
    (tmp_path / "service" / "w.py").write_text(
        '"""Writes written.json, not docstring.json."""\n'
        'OUT = "results/written.json"  # comment.json\n'
        'LOG = "see longer.json here"\n')
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    doc = _doc(tmp_path, "`written.json` `w.py` `docstring.json` `comment.json` `longer.json`\n")
    assert [p.split("`")[1] for p in check_paths(doc, tmp_path)] == ["docstring.json", "comment.json", "longer.json"]


def test_the_name_check_fails_on_a_renamed_function(tmp_path):
    assert resolves("hooks.build") and resolves("service.step_model.price.price_cell")
    assert resolves("service.step_model.trial.TrialTimeline.price") and resolves("hooks.cost.DEFAULT_LATENCY_S")
    assert not resolves("service.no_such_module.f")
    assert not resolves("service.step_model.trial.TrialTimeline.no_such_method")
    doc = _doc(tmp_path, "`hooks.cost.hook_collectives` and `hooks.cost.no_such_function()`\n")
    assert check_names(doc, ROOT) == [f"{doc}:1: `hooks.cost.no_such_function()`: not defined by the code"]


def test_another_checkout_is_checked_against_its_own_tree(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("Run `make sweep`; see `docs/guide.md`. Measured 2026-12-05.\n")
    (tmp_path / "docs" / "guide.md").write_text("Nothing to see.\n")
    (tmp_path / "Makefile").write_text("sweep:\n\techo\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    found = all_problems(tmp_path)
    assert found["history prose"] == ["README.md:1: a date: '2026-12-05' (git keeps the history)"]
    assert not found["commands"] and not found["paths"]
