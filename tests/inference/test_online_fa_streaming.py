"""Tests for latentzoo.streaming.run_streaming_fa (back end of `latentzoo run fa --method online-*`)."""

import numpy as np
import pytest

from latentzoo.inference.fa.online import OnlineFactorAnalysis
from latentzoo.streaming import run_streaming_fa


def _data(n=640, D=6, seed=0):
    rng = np.random.default_rng(seed)
    F = rng.standard_normal((D, 2))
    return rng.standard_normal((n, 2)) @ F.T + rng.standard_normal((n, D))


def test_csv_stream_equals_in_memory_fit(tmp_path):
    X = _data()
    p = tmp_path / "x.csv"
    np.savetxt(p, X, delimiter=",", header=",".join(f"c{i}" for i in range(6)), comments="")
    out = tmp_path / "out"
    s = run_streaming_fa(str(p), method="online-em", n_components=2, out_dir=str(out), chunk_size=64, seed=3)
    ref = OnlineFactorAnalysis(2, random_state=3).fit(X)  # chunks are multiples of the batch size
    z = np.load(out / "params.npz")
    np.testing.assert_allclose(z["components"], ref.components_, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(z["noise_variance"], ref.noise_variance_, rtol=1e-8)
    np.testing.assert_allclose(z["mean"], ref.mean_, rtol=1e-10)
    assert s["n_samples"] == 640 and s["n_features"] == 6 and s["method"] == "em"
    lines = (out / "summary.csv").read_text().splitlines()
    assert lines[0].startswith("feature,mean,noise_variance") and len(lines) == 7
    assert not [f for f in out.iterdir() if f.name.startswith(".tmp-")]


def test_npy_stream_and_sga(tmp_path):
    p = tmp_path / "x.npy"
    np.save(p, _data())
    s = run_streaming_fa(str(p), method="sga", n_components=1, out_dir=str(tmp_path / "o"), chunk_size=100)
    assert s["n_samples"] == 640 and np.isfinite(s["avg_loglik_last_chunk"])


def test_synthetic_default_quick(tmp_path):
    s = run_streaming_fa(None, method="em", n_components=5, out_dir=str(tmp_path), quick=True)
    assert s["n_samples"] == 2000 and s["n_features"] == 50
    assert (tmp_path / "params.npz").exists()


@pytest.mark.parametrize(
    "content, match",
    [
        ("1,2,3\n4,5\n", "fields where 3 were expected"),
        ("1,2,3\n4,x,6\n", "non-numeric"),
        ("1,2,3\n4,nan,6\n", "NaN or infinity"),
        ("1,2,3\n", "At least 2 rows"),
        ("1,2\n3,4\n5,6\n", "smaller than the number of features"),
    ],
)
def test_bad_csv_raises(tmp_path, content, match):
    p = tmp_path / "bad.csv"
    p.write_text(content)
    k = 2
    with pytest.raises(ValueError, match=match):
        run_streaming_fa(str(p), method="em", n_components=k, out_dir=str(tmp_path / "o"))
    assert not (tmp_path / "o" / "params.npz").exists()


def test_missing_file_and_bad_method(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        run_streaming_fa(str(tmp_path / "nope.csv"), method="em", n_components=1, out_dir=str(tmp_path))
    with pytest.raises(ValueError, match="method"):
        run_streaming_fa(None, method="pca", n_components=1, out_dir=str(tmp_path))
