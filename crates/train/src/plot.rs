//! PNG curves of a run's epoch history (the `plotters` crate): one chart per logged quantity,
//! its training value and, where logged, its validation value (`val_<name>`) against the
//! epoch, written as `<dir>/plots/<name>.png` (`loss.png`, `acc.png`, ...). The Trainer
//! rewrites them after every epoch when `TrainerConfig::plot` is on.
//!
//! Charts are drawn into an RGB buffer and encoded with the `image` crate. Titles and axis
//! labels need a TrueType font: `FERRITE_PLOT_FONT` (a .ttf path) or one of the usual system
//! fonts (DejaVu, Liberation, Noto); without one the curves and grid are drawn unlabelled.

use crate::error::{Error, Result};
use crate::trainer::Logs;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const SIZE: (u32, u32) = (800, 500);

/// Quantities the epoch line logs that are not curves worth a chart of their own.
const SKIP: [&str; 3] = ["lr", "samples_per_s", "data_wait"];

const FONTS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Registers a font once per process; whether text can be drawn.
fn font() -> bool {
    static FONT: OnceLock<bool> = OnceLock::new();
    *FONT.get_or_init(|| {
        let candidates = std::env::var_os("FERRITE_PLOT_FONT")
            .map(PathBuf::from)
            .into_iter()
            .chain(FONTS.iter().map(PathBuf::from));
        for path in candidates {
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            // plotters keeps registered fonts for the whole process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return true;
            }
        }
        false
    })
}

/// The names with a chart: every logged key that is not a validation twin or a rate.
fn chart_names(history: &[Logs]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for logs in history {
        for k in logs.keys() {
            let base = k.strip_prefix("val_").unwrap_or(k);
            if !SKIP.contains(&base) && !names.iter().any(|n| n == base) {
                names.push(base.to_string());
            }
        }
    }
    names
}

fn plot_err(e: impl std::fmt::Display) -> Error {
    Error::data("plot", e.to_string())
}

/// Writes `<dir>/plots/<name>.png` for every quantity in `history` (one entry per epoch);
/// returns the files written.
pub fn write_plots(history: &[Logs], dir: &Path) -> Result<Vec<PathBuf>> {
    let out = dir.join("plots");
    std::fs::create_dir_all(&out)
        .map_err(|e| Error::data("plot", format!("cannot create {}: {e}", out.display())))?;
    let mut written = Vec::new();
    for name in chart_names(history) {
        let path = out.join(format!("{name}.png"));
        let series: Vec<(String, Vec<(f64, f64)>)> = [name.clone(), format!("val_{name}")]
            .into_iter()
            .map(|k| {
                let pts = history
                    .iter()
                    .enumerate()
                    .filter_map(|(i, l)| l.get(&k).map(|&v| ((i + 1) as f64, v)))
                    .filter(|(_, v)| v.is_finite())
                    .collect();
                (k, pts)
            })
            .collect();
        chart(&name, &series, &path)?;
        written.push(path);
    }
    Ok(written)
}

/// One chart of `series` (name, (epoch, value) points) as a PNG at `path`.
fn chart(title: &str, series: &[(String, Vec<(f64, f64)>)], path: &Path) -> Result<()> {
    let (w, h) = SIZE;
    let mut buf = vec![255u8; (w * h * 3) as usize];
    let pts = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x1, mut y0, mut y1) = (1.0f64, f64::INFINITY, f64::NEG_INFINITY);
    for &(x, y) in pts {
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if !y0.is_finite() {
        (y0, y1) = (0.0, 1.0);
    }
    let pad = ((y1 - y0) * 0.05).max(1e-6);
    let text = font();
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut builder = ChartBuilder::on(&root);
        builder.margin(15);
        if text {
            builder
                .caption(title, ("sans-serif", 24))
                .x_label_area_size(40)
                .y_label_area_size(60);
        }
        let mut c = builder
            .build_cartesian_2d(1.0..x1.max(2.0), (y0 - pad)..(y1 + pad))
            .map_err(plot_err)?;
        let mut mesh = c.configure_mesh();
        if text {
            mesh.x_desc("epoch");
        } else {
            mesh.disable_x_axis().disable_y_axis();
        }
        mesh.draw().map_err(plot_err)?;
        let colors = [BLUE, RED];
        for ((label, p), color) in series.iter().zip(colors) {
            if p.is_empty() {
                continue;
            }
            let s = c
                .draw_series(LineSeries::new(p.iter().copied(), color.stroke_width(2)))
                .map_err(plot_err)?;
            if text {
                s.label(label.as_str()).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            }
            c.draw_series(p.iter().map(|&xy| Circle::new(xy, 3, color.filled())))
                .map_err(plot_err)?;
        }
        if text {
            c.configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(plot_err)?;
        }
        root.present().map_err(plot_err)?;
    }
    image::save_buffer(path, &buf, w, h, image::ExtendedColorType::Rgb8)
        .map_err(|e| Error::data("plot", format!("cannot write {}: {e}", path.display())))
}
