//! The command line's [`Host`]: progress bars drawn with `indicatif` on
//! standard error (only when it is a terminal), and `plot(..)` drawn with
//! `plotters` into the PNG file named by `adjoint run --plot FILE`.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use adjoint_runtime::host::Host;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

pub struct CliHost {
    bars: MultiProgress,
    /// The active bars, innermost last.
    stack: Vec<ProgressBar>,
    plot: Option<PathBuf>,
}

impl CliHost {
    pub fn new(plot: Option<PathBuf>) -> CliHost {
        // indicatif draws on standard error only when it is a terminal.
        CliHost {
            bars: MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
            stack: Vec::new(),
            plot,
        }
    }
}

impl Host for CliHost {
    fn progress_start(&mut self, len: u64) {
        let bar = self.bars.add(ProgressBar::new(len));
        let style = ProgressStyle::with_template(
            "{bar:30.cyan/blue} {pos:>5}/{len:5} [{elapsed_precise} < {eta_precise}] {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        self.stack.push(bar);
    }

    fn progress_set(&mut self, done: u64) {
        if let Some(bar) = self.stack.last() {
            bar.set_position(done);
        }
    }

    fn progress_note(&mut self, message: &str) {
        if let Some(bar) = self.stack.last() {
            bar.set_message(message.to_string());
        }
    }

    fn progress_end(&mut self) {
        if let Some(bar) = self.stack.pop() {
            if let Some(len) = bar.length() {
                bar.set_position(len);
            }
            if self.stack.is_empty() {
                // The outermost bar stays on screen, complete; the cursor
                // goes below it, and a new loop gets a new set of bars
                // (the old one would redraw over what was printed since).
                bar.finish();
                self.bars = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
                if std::io::stderr().is_terminal() {
                    let _ = writeln!(std::io::stderr());
                }
            } else {
                bar.finish_and_clear();
                self.bars.remove(&bar);
            }
        }
    }

    fn suspend(&mut self, write: &mut dyn FnMut()) {
        if self.stack.is_empty() {
            write()
        } else {
            self.bars.suspend(write)
        }
    }

    fn plot(&mut self, title: &str, ys: &[f64], columns: usize) -> Result<(), String> {
        match &self.plot {
            Some(path) => draw_png(path, title, ys, columns)
                .map_err(|e| format!("cannot write \"{}\": {e}", path.display())),
            None => Ok(()),
        }
    }
}

impl Drop for CliHost {
    fn drop(&mut self) {
        // A program that returned, or failed, inside a progress loop: its
        // bars stay as they were, and what follows goes below them.
        let open = !self.stack.is_empty();
        for bar in self.stack.drain(..) {
            bar.abandon();
        }
        if open && std::io::stderr().is_terminal() {
            let _ = writeln!(std::io::stderr());
        }
    }
}

/// Fonts looked for to label plots (DejaVu and Liberation ship with most
/// Linux distributions); without one, plots are drawn without text.
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/Library/Fonts/Arial.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// Registers the first font of [`FONTS`] that loads as plotters'
/// "sans-serif" (once per process); whether there is one.
fn have_font() -> bool {
    static FOUND: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FOUND.get_or_init(|| {
        FONTS.iter().any(|path| match std::fs::read(path) {
            Ok(bytes) => {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                plotters::style::register_font(
                    "sans-serif",
                    plotters::style::FontStyle::Normal,
                    bytes,
                )
                .is_ok()
            }
            Err(_) => false,
        })
    })
}

/// Draws one line per column of the row-major `ys` against the row index:
/// 800 x 500 pixels, white background, grid lines; with a system font
/// (see [`FONTS`]) the title above and numbered axes, without one a frame
/// and no text.
fn draw_png(path: &std::path::Path, title: &str, ys: &[f64], columns: usize) -> Result<(), String> {
    use plotters::prelude::*;
    let columns = columns.max(1);
    let rows = ys.len() / columns;
    let finite = ys.iter().copied().filter(|y| y.is_finite());
    let lo = finite.clone().fold(f64::INFINITY, f64::min);
    let hi = finite.fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = if lo.is_finite() && hi > lo {
        let pad = (hi - lo) * 0.05;
        (lo - pad, hi + pad)
    } else if lo.is_finite() {
        (lo - 1.0, lo + 1.0)
    } else {
        (0.0, 1.0)
    };
    let x_max = (rows.max(2) - 1) as f64;
    let root = BitMapBackend::new(path, (800, 500)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| e.to_string();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let grid = RGBColor(220, 220, 220);
    let text = have_font();
    let mut chart = if text {
        let mut b = ChartBuilder::on(&root);
        b.margin(15).x_label_area_size(35).y_label_area_size(70);
        if !title.is_empty() {
            b.caption(title, ("sans-serif", 24));
        }
        b.build_cartesian_2d(0.0..x_max, lo..hi)
            .map_err(|e| err(&e))?
    } else {
        ChartBuilder::on(&root.margin(20, 20, 20, 20))
            .build_cartesian_2d(0.0..x_max, lo..hi)
            .map_err(|e| err(&e))?
    };
    if text {
        chart
            .configure_mesh()
            .light_line_style(grid)
            .bold_line_style(grid)
            .label_style(("sans-serif", 15))
            .draw()
            .map_err(|e| err(&e))?;
    } else {
        for k in 1..10 {
            let x = x_max * k as f64 / 10.0;
            let y = lo + (hi - lo) * k as f64 / 10.0;
            chart
                .draw_series(LineSeries::new([(x, lo), (x, hi)], grid))
                .map_err(|e| err(&e))?;
            chart
                .draw_series(LineSeries::new([(0.0, y), (x_max, y)], grid))
                .map_err(|e| err(&e))?;
        }
        let frame = [(0.0, lo), (x_max, lo), (x_max, hi), (0.0, hi), (0.0, lo)];
        chart
            .draw_series(LineSeries::new(frame, BLACK))
            .map_err(|e| err(&e))?;
    }
    let colors = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    for c in 0..columns {
        let points: Vec<(f64, f64)> = (0..rows)
            .map(|r| (r as f64, ys[r * columns + c]))
            .filter(|(_, y)| y.is_finite())
            .collect();
        let style = colors[c % colors.len()].stroke_width(2);
        chart
            .draw_series(LineSeries::new(points, style))
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
