"""Client results saved as they arrive (run.checkpoint_clients): a run SIGKILLed in the middle
of a round resumes without retraining the clients that had finished, and ends with exactly the
metrics of an uninterrupted run; a fresh fit and a changed setting never reuse a saved result."""

import os
import re
import signal

import pytest

from fl_lightning import cli
from fl_lightning.client_journal import FOLDER
from tests.conftest import outcome, tiny_args

BATCHES_PER_CLIENT = 12  # 60 samples, B = 10, 2 epochs (tiny_args); 3 clients a round


def args(run_dir, rounds, *extra):
    return tiny_args(run_dir, "--federation.rounds", str(rounds), "--run.checkpoint_every", "1",
                     "--run.checkpoint_clients", "true", *extra)


@pytest.fixture
def batches_trained(monkeypatch):
    """Counts the training batches clients draw in this process from now on."""
    from fl_lightning.data.batches import ClientBatches

    draw, count = ClientBatches.__iter__, [0]

    def counted(self):
        for batch in draw(self):
            count[0] += 1
            yield batch

    monkeypatch.setattr(ClientBatches, "__iter__", counted)
    return count


def fit_killed(spec, run_dir, rounds) -> None:
    """``fit`` in a forked child that SIGKILLs itself at ``spec`` (tests/killpoints.py)."""
    from tests import killpoints

    pid = os.fork()
    if pid == 0:
        try:
            killpoints.arm(spec)
            cli.main(["fit", *args(run_dir, rounds)])
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"not killed at {spec}"


# (rounds, kill point, where, clients whose results were saved before the kill)
CASES = [
    (1, "batch:30", "in the 3rd client of a one-round run (a one-shot method's whole run)", 2),
    (2, "batch:66", "in round 2's 3rd client, after round 1's checkpoint", 2),
    (1, "checkpoint_write:2", "while saving the 2nd client's result", 1),
]


@pytest.mark.parametrize("rounds, spec, where, saved", CASES, ids=[c[1] for c in CASES])
def test_a_run_killed_mid_round_retrains_only_the_clients_without_a_saved_result(
        tmp_path, capsys, batches_trained, rounds, spec, where, saved):
    straight = cli.main(["fit", *args(tmp_path / "straight", rounds)])
    assert not (tmp_path / "straight" / FOLDER).exists()  # cleared when the fit ends
    run = tmp_path / "run"
    fit_killed(spec, run, rounds)
    assert len(list((run / FOLDER).glob(f"round-{rounds:04d}/client-*.pt"))) == saved
    batches_trained[0] = 0

    resumed = cli.main(["fit", *args(run, rounds), "--ckpt_path", "last"])

    assert batches_trained[0] == (3 - saved) * BATCHES_PER_CLIENT, where
    assert f"round {rounds}: reusing the saved results of clients" in capsys.readouterr().err
    assert outcome(resumed) == outcome(straight) and resumed["final_accuracy"] == straight["final_accuracy"]
    assert not (run / FOLDER).exists()


def test_a_fresh_fit_or_a_changed_setting_trains_every_client_again(tmp_path, batches_trained):
    run = tmp_path / "run"
    fit_killed("batch:30", run, 1)
    batches_trained[0] = 0
    cli.main(["fit", *args(run, 1, "--federation.batch_size", "20"), "--ckpt_path", "last"])
    assert batches_trained[0] == 3 * BATCHES_PER_CLIENT // 2  # other batches: nothing reused

    fresh = tmp_path / "fresh"
    fit_killed("batch:30", fresh, 1)
    batches_trained[0] = 0
    cli.main(["fit", *args(fresh, 1), "--run.overwrite", "true"])  # no --ckpt_path: a fresh run
    assert batches_trained[0] == 3 * BATCHES_PER_CLIENT


def test_a_resume_says_when_reused_results_were_trained_by_other_code(tmp_path, capsys, monkeypatch):
    """The fingerprint covers settings and data, not code: results saved by another commit are
    still reused (a session's commit between the kill and the resume may touch only docs), but
    the resume names the clients and both commits, and says nothing when the code is the same."""
    import fl_lightning.client_journal as journal

    same = {"commit": "a" * 40, "dirty": False}
    monkeypatch.setattr(journal, "git_state", lambda: same)
    fit_killed("batch:30", tmp_path / "same", 1)
    cli.main(["fit", *args(tmp_path / "same", 1), "--ckpt_path", "last"])
    assert "were trained by" not in capsys.readouterr().err

    fit_killed("batch:30", tmp_path / "other", 1)
    monkeypatch.setattr(journal, "git_state", lambda: {"commit": "b" * 40, "dirty": True})
    cli.main(["fit", *args(tmp_path / "other", 1), "--ckpt_path", "last"])
    err = capsys.readouterr().err
    reused = re.search(r"reusing the saved results of clients (\[[0-9, ]+\])", err).group(1)
    assert (f"round 1: clients {reused} were trained by commit aaaaaaaaaa, this run is commit bbbbbbbbbb "
            "with uncommitted changes") in err


def test_results_are_handed_on_as_clients_finish_and_returned_in_job_order():
    """Worker processes finish in any order: each result reaches on_result (and the journal) as
    it arrives, not after a slower client started before it; the lists keep job order."""
    import torch

    from fl_lightning.client import ClientFailure, collect_as_finished
    from fl_lightning.messages import ClientResult

    def result(k):
        return ClientResult(k, {"w": torch.zeros(1)}, num_samples=10)

    finished = [(2, result(12)), (0, ClientFailure(10, "timeout")), (3, result(13)), (1, result(11))]
    seen = []

    results, failures = collect_as_finished(iter(finished), 4, lambda r, done, total: seen.append((r.client_id, done)))

    assert seen == [(12, 1), (13, 3), (11, 4)]
    assert [r.client_id for r in results] == [11, 12, 13] and [f.client_id for f in failures] == [10]
