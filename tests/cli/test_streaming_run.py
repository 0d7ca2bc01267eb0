"""`latentzoo run fa --method online-*`: the file is streamed chunk by chunk and the run folder is
the same as every other method's (posterior.nc, summary.csv, trace.png)."""

import numpy as np
import pytest

from latentzoo import arviz_adapter as azx
from latentzoo.cli import main
from latentzoo.inference.fa import OnlineFactorAnalysis


def _data(n=640, D=6, seed=0):
    rng = np.random.default_rng(seed)
    F = rng.standard_normal((D, 2))
    return rng.standard_normal((n, 2)) @ F.T + rng.standard_normal((n, D))


def _run(tmp_path, *args):
    out = tmp_path / "out"
    code = main(["run", "fa", *args, "--no-progress", "--out", str(out)])
    return code, out


def test_csv_stream_equals_in_memory_fit(tmp_path):
    X = _data()
    p = tmp_path / "x.csv"
    np.savetxt(p, X, delimiter=",", header=",".join(f"c{i}" for i in range(6)), comments="")
    code, out = _run(tmp_path, "--method", "online-em", "--data", str(p), "--K", "2",
                     "--chunk-size", "64", "--seed", "3")
    assert code == 0
    ref = OnlineFactorAnalysis(2, random_state=3).fit(X)  # chunks are multiples of the batch size
    post = azx.load(str(out / "posterior.nc")).posterior
    np.testing.assert_allclose(np.asarray(post["W"])[0, 0], ref.components_.T, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(1.0 / np.asarray(post["psi"])[0, 0], ref.noise_variance_, rtol=1e-8)
    np.testing.assert_allclose(np.asarray(post["mu"])[0, 0], ref.mean_, rtol=1e-10)
    assert not [f for f in out.iterdir() if f.name.startswith(".tmp-")]


def test_npy_stream_sga_and_standardize(tmp_path):
    p = tmp_path / "x.npy"
    X = _data() * 100.0 + 7.0
    np.save(p, X)
    code, out = _run(tmp_path, "--method", "online-sga", "--data", str(p), "--K", "1",
                     "--chunk-size", "100", "--standardize")
    assert code == 0
    mu = np.asarray(azx.load(str(out / "posterior.nc")).posterior["mu"])[0, 0]
    assert np.all(np.abs(mu) < 0.2)  # standardized stream: column means near 0, not 7


def test_synthetic_default_quick(tmp_path):
    code, out = _run(tmp_path, "--method", "online-em", "--K", "5", "--quick")
    assert code == 0
    assert azx.load(str(out / "posterior.nc")).posterior["W"].shape == (1, 1, 50, 5)


@pytest.mark.parametrize(
    "content, match",
    [
        ("1,2,3\n4,5\n", "fields where 3 were expected"),
        ("1,2,3\n4,x,6\n", "non-numeric"),
        ("1,2,3\n4,nan,6\n", "NaN or infinity"),
        ("1,2,3\n", "At least 2 rows"),
        ("1,2\n3,4\n5,6\n", "smaller than the number of columns"),
    ],
)
def test_bad_csv_is_one_sentence(tmp_path, capsys, content, match):
    p = tmp_path / "bad.csv"
    p.write_text(content)
    code, out = _run(tmp_path, "--method", "online-em", "--data", str(p), "--K", "2")
    err = capsys.readouterr().err.strip()
    assert code == 2 and match in err and "\n" not in err
    assert not out.exists()


def test_missing_file(tmp_path, capsys):
    code, _ = _run(tmp_path, "--method", "online-em", "--data", str(tmp_path / "nope.csv"), "--K", "1")
    assert code == 2 and "does not exist" in capsys.readouterr().err
