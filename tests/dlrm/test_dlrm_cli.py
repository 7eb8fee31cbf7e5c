"""``pace dlrm``: synthetic and given features, and errors that name the bad value."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pace_core import cli
from pace_core.dlrm import DLRMConfig, SyntheticClicks
from pace_core.dlrm.weights import random_state, save

CONFIG = DLRMConfig.tiny()


def test_synthetic_batch_prints_probabilities_and_metrics(capsys):
    assert cli.main(["dlrm", "--preset", "tiny", "--batch", "64", "--eval"]) == 0
    out = capsys.readouterr().out.splitlines()
    probs = [float(line.split("\t")[1]) for line in out[:10]]
    assert all(0 < p < 1 for p in probs)
    assert out[10].startswith("... 64 samples")
    assert out[11].startswith("logloss ") and out[12].startswith("auc ")


@pytest.fixture
def files(tmp_path):
    state = random_state(CONFIG, seed=0)
    weights = save(tmp_path / "w.pt", CONFIG, state)
    batch = SyntheticClicks(CONFIG, state, seed=0).batch(32)
    return weights, batch, tmp_path


def _npz(path, dense, sparse, labels=None):
    arrays = {"dense": np.asarray(dense), **{f"sparse_{i}": np.asarray(t)
                                            for i, t in enumerate(sparse)}}  # fmt: skip
    if labels is not None:
        arrays["labels"] = np.asarray(labels)
    np.savez(path, **arrays)
    return path


def test_given_weights_and_npz_features(files, capsys):
    weights, batch, tmp = files
    feats = _npz(tmp / "f.npz", batch.dense, batch.sparse, batch.labels)
    args = ["dlrm", "--weights", str(weights), "--features", str(feats), "--eval",
            "--quantization", "int8"]  # fmt: skip
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "... 32 samples" in out and "logloss" in out


def test_pt_features_with_one_sparse_tensor(files, capsys):
    weights, batch, tmp = files
    one_hot = torch.stack([t[:, 0] for t in batch.sparse], dim=1)  # [B, 4]
    torch.save({"dense": batch.dense, "sparse": one_hot}, tmp / "f.pt")
    assert cli.main(["dlrm", "--weights", str(weights), "--features", str(tmp / "f.pt")]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 11


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d, s: (d, s[:3]), "got 3 sparse features; this model has 4 tables"),
        (lambda d, s: (d, [s[0], s[1], s[2], s[3] + 10]), "sparse feature 3 has id 1"),
        (lambda d, s: (d, [s[0].float(), *s[1:]]), "sparse feature 0 has dtype float32"),
        (lambda d, s: (d[:, :5], s), "dense features have shape (32, 5)"),
        (lambda d, s: (d.index_fill(0, torch.tensor([3, 7]), float("nan")), s),
         "dense features of 2 sample(s) hold NaN or infinite values (rows 3, 7)"),
        (lambda d, s: (d[:0], [t[:0] for t in s]), "holds no samples: its 'dense' array"),
    ],
)
def test_bad_features_exit_2_with_the_reason(files, capsys, edit, message):
    weights, batch, tmp = files
    dense, sparse = edit(batch.dense, batch.sparse)
    feats = _npz(tmp / "bad.npz", dense, sparse)
    assert cli.main(["dlrm", "--weights", str(weights), "--features", str(feats)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pace: error: ") and message in err


def test_eval_without_labels_and_a_bad_file(files, capsys):
    weights, batch, tmp = files
    feats = _npz(tmp / "f.npz", batch.dense, batch.sparse)
    assert cli.main(["dlrm", "--weights", str(weights), "--features", str(feats), "--eval"]) == 2
    assert "--eval needs labels" in capsys.readouterr().err
    (tmp / "f.csv").write_text("1,2,3\n")
    assert cli.main(["dlrm", "--features", str(tmp / "f.csv")]) == 2
    assert "use .npz or .pt" in capsys.readouterr().err
    (tmp / "junk.pt").write_bytes(b"not a torch save")  # was torch's traceback, exit 1
    assert cli.main(["dlrm", "--weights", str(tmp / "junk.pt")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert cli.main(["dlrm", "--features", str(tmp / "junk.pt")]) == 2
    assert "cannot read features file" in capsys.readouterr().err


def test_int8_static_calibrates_on_synthetic_samples(capsys):
    argv = ["dlrm", "--preset", "tiny", "--batch", "64", "--eval", "--quantization",
            "int8-static", "--calibration-samples", "300"]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert all(0 < float(line.split("\t")[1]) < 1 for line in out[:10])
    assert out[11].startswith("logloss ")


def test_eval_refuses_labels_that_are_not_clicks(files, capsys):
    weights, batch, tmp = files
    labels = batch.labels.clone()
    labels[5] = 7  # was scored as a log loss of 7.57
    feats = _npz(tmp / "f.npz", batch.dense, batch.sparse, labels)
    assert cli.main(["dlrm", "--weights", str(weights), "--features", str(feats), "--eval"]) == 2
    assert "labels are clicks, 0 or 1; the features file has 1 other value(s), e.g. 7" in (
        capsys.readouterr().err
    )
