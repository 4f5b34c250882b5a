"""python/examples/train_digits.py: the digits MLP trained from Python."""

import re
import subprocess
import sys

from conftest import REPO

SCRIPT = REPO / "python/examples/train_digits.py"


def run(args, prelude=""):
    code = (prelude + "\nimport runpy, sys\nsys.argv = [%r] + %r\n"
            "runpy.run_path(%r, run_name='__main__')\n") % (str(SCRIPT), args, str(SCRIPT))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_example_trains_and_plots(tmp_path):
    png = tmp_path / "loss.png"
    out = run(["--epochs", "5", "--plot", str(png)])
    losses = [float(x) for x in re.findall(r"epoch +\d+ +loss ([\d.]+)", out)]
    assert len(losses) == 2 and losses[1] < 0.5 * losses[0], out
    acc = float(re.search(r"test accuracy: +([\d.]+)", out).group(1))
    assert acc > 0.8, out
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in out
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_the_plot_is_skipped(tmp_path):
    # A None entry in sys.modules makes `import matplotlib` fail.
    out = run(["--epochs", "1", "--plot", str(tmp_path / "x.png")],
              prelude="import sys; sys.modules['matplotlib'] = None")
    assert "matplotlib is not installed: no plot" in out
    assert not (tmp_path / "x.png").exists()
