"""HTML reports, figures and comparisons: rendered for real and read back."""

import base64
import json
import re
import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from rksp_cli.cli import app

runner = CliRunner()
SMALL = "model: {n_layers: 3, d_model: 32}\nprobe: {tokens: 256}\n"
PNG = b"\x89PNG\r\n\x1a\n"


def rksp(*args):
    return runner.invoke(app, [str(a) for a in args])


def embedded_images(page: str) -> list[bytes]:
    return [base64.b64decode(data) for data in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


@pytest.fixture(scope="module")
def screened(tmp_path_factory):
    """One risky screen with its report, plot and JSON, and a safer variant's JSON to compare."""
    d = tmp_path_factory.mktemp("screens")
    (d / "risky.yaml").write_text(SMALL.replace("d_model: 32", "d_model: 32, norm: none") + "training: {lr: 0.05}\n")
    (d / "safe.yaml").write_text(SMALL + "training: {lr: 0.001}\n")
    risky = rksp("screen", d / "risky.yaml", "--json", "--report", d / "risky.html", "--plot", d / "risky.png")
    assert risky.exit_code == 0, risky.output
    (d / "risky.json").write_text(risky.stdout)
    safe = rksp("screen", d / "safe.yaml", "--json")
    (d / "safe.json").write_text(safe.stdout)
    return d


def test_screen_report_is_one_self_contained_page_with_every_section(screened):
    page = (screened / "risky.html").read_text()
    data = json.loads((screened / "risky.json").read_text())
    assert data["verdict"].upper() in page and data["reason"].split(" (")[0] in page
    for section in ("Eigenvalues per layer", "Masses and spectral radius over depth", "Risk against learning rate"):
        assert section in page
    assert "norm: none" in page and "lr: 0.05" in page  # the resolved config
    images = embedded_images(page)
    assert len(images) == 3 and all(img.startswith(PNG) and len(img) > 5000 for img in images)
    assert not re.search(r'(src|href)="https?://', page), "a report must not fetch anything"


def test_plot_writes_the_eigenvalue_figure_alone(screened):
    assert (screened / "risky.png").read_bytes().startswith(PNG)


def test_rule_based_report_says_there_is_no_risk_curve(screened, tmp_path):
    result = rksp("screen", screened / "safe.yaml", "--calibration", "none", "--report", tmp_path / "r.html")
    assert result.exit_code == 0, result.output
    page = (tmp_path / "r.html").read_text()
    assert "does not depend on the learning rate" in page and len(embedded_images(page)) == 2


@pytest.mark.parametrize("flag", ["--report", "--plot"])
def test_wrong_figure_suffix_exits_2_before_any_work(screened, tmp_path, flag):
    target = tmp_path / "out.txt"
    result = rksp("screen", screened / "safe.yaml", flag, target)
    assert result.exit_code == 2 and flag in result.stderr and not target.exists()


def test_compare_markdown_for_a_ci_comment(screened, tmp_path):
    result = rksp("compare", screened / "risky.json", screened / "safe.json", "--format", "markdown",
                  "--report", tmp_path / "c.html")  # fmt: skip
    assert result.exit_code == 0, result.output
    before, after = (json.loads((screened / f"{n}.json").read_text())["verdict"] for n in ("risky", "safe"))
    assert result.stdout.startswith(f"**rksp: verdict {before} → {after}**")
    assert "| `model.norm` | none | pre |" in result.stdout and "| `training.lr` | 0.05 | 0.001 |" in result.stdout
    assert "feature.near_unit_mass_mean" in result.stdout
    page = (tmp_path / "c.html").read_text()
    assert "model.norm" in page and "verdict" in page


def test_compare_of_identical_screens_says_so(screened):
    result = rksp("compare", screened / "safe.json", screened / "safe.json", "--format", "markdown")
    assert result.exit_code == 0 and result.stdout.startswith("**rksp: verdict unchanged")
    assert "Config: identical." in result.stdout and "| risk |" in result.stdout


def test_compare_rejects_what_is_not_a_screen(screened, tmp_path):
    (tmp_path / "other.json").write_text('{"hello": 1}')
    (tmp_path / "broken.json").write_text("{")
    for bad in ("other.json", "broken.json", "missing.json"):
        result = rksp("compare", tmp_path / bad, screened / "safe.json")
        assert result.exit_code == 2 and bad in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_sweep_report_with_probes_has_heatmap_riskiest_points_and_reliability(tmp_path):
    (tmp_path / "base.yaml").write_text(SMALL.replace("n_layers: 3", "n_layers: 2") + "training: {steps: 15}\n")
    grid = tmp_path / "grid.yaml"
    grid.write_text("base: base.yaml\naxes:\n  training.lr: [0.001, 0.5]\n  model.norm: [pre, none]\n")
    result = rksp("sweep", grid, "--out", tmp_path / "s.parquet", "--probe", "--report")
    assert result.exit_code == 0, result.output
    page = (tmp_path / "s-report.html").read_text()
    assert "Riskiest points" in page and "Predicted against observed (4 probed points)" in page
    assert len(embedded_images(page)) == 2  # heatmap (predicted and observed panels) and reliability


CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


@pytest.mark.skipif(CHROMIUM is None, reason="no headless chromium on this machine (Debian: apt install chromium)")
def test_report_renders_in_a_real_browser(screened, tmp_path):
    import matplotlib.image

    shot = tmp_path / "shot.png"
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}", "--window-size=1200,2400",
         (screened / "risky.html").as_uri()],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[0] >= 2000 and pixels.std() > 0.05  # rendered content, not a blank page
