//! PNG and SVG charts with `plotters` (chosen by the output's extension).
//!
//! Text is drawn with plotters' pure-Rust `ab_glyph` renderer, so no system
//! font library is needed; it does need one TrueType font file, looked up at
//! run time: `$NVWC_FONT` if set, else DejaVu Sans (Debian package
//! `fonts-dejavu-core`) or Liberation Sans (`fonts-liberation`) at their
//! Debian paths. [`font_available`] tells whether one was found.
//!
//! Charts: [`LinePlot`] (one line per series, optional log axes and vertical
//! markers, e.g. knees) and [`BarPlot`] (grouped bars). [`render`] lays out
//! several charts in a grid in one file.

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::SimError;

/// Font files tried in order after `$NVWC_FONT`.
pub const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/liberation2/LiberationSans-Regular.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

static FONT: OnceLock<Result<(), String>> = OnceLock::new();

fn register_font() -> Result<(), SimError> {
    FONT.get_or_init(|| {
        let mut tried = Vec::new();
        let env = std::env::var("NVWC_FONT").ok();
        for p in env
            .iter()
            .map(|s| s.as_str())
            .chain(FONT_PATHS.iter().copied())
        {
            tried.push(p.to_string());
            if let Ok(bytes) = std::fs::read(p) {
                let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                for style in [FontStyle::Normal, FontStyle::Bold] {
                    plotters::style::register_font("sans-serif", style, leaked)
                        .map_err(|_| format!("{p} is not a usable TrueType font"))?;
                }
                return Ok(());
            }
        }
        Err(format!(
            "no font found for plots (tried {}); install fonts-dejavu-core or set NVWC_FONT",
            tried.join(", ")
        ))
    })
    .clone()
    .map_err(SimError::Plot)
}

/// Whether a font for plot text was found.
pub fn font_available() -> bool {
    register_font().is_ok()
}

/// How an axis is scaled and labelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Axis {
    /// Linear, plain numbers.
    #[default]
    Linear,
    /// Logarithmic (base 2), labels as byte sizes (`4M`, `1G`).
    Log2Bytes,
    /// Logarithmic (base 10), plain numbers.
    Log10,
    /// Linear, labels as byte sizes.
    LinearBytes,
}

impl Axis {
    fn fwd(self, v: f64) -> f64 {
        match self {
            Axis::Log2Bytes => v.max(1e-300).log2(),
            Axis::Log10 => v.max(1e-300).log10(),
            _ => v,
        }
    }
    fn label(self, v: f64) -> String {
        match self {
            Axis::Log2Bytes => crate::format_size(2f64.powf(v).round() as u64),
            Axis::Log10 => num(10f64.powf(v)),
            Axis::LinearBytes => crate::format_size(v.max(0.0).round() as u64),
            Axis::Linear => num(v),
        }
    }
}

fn num(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// A named line.
#[derive(Clone, Debug, Default)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// `(x, y)` points in data units.
    pub points: Vec<(f64, f64)>,
}

/// A line chart.
#[derive(Clone, Debug, Default)]
pub struct LinePlot {
    /// Title above the chart.
    pub title: String,
    /// X axis caption.
    pub x_label: String,
    /// Y axis caption.
    pub y_label: String,
    /// X axis scale.
    pub x_axis: Axis,
    /// Y axis scale.
    pub y_axis: Axis,
    /// Lines.
    pub series: Vec<Series>,
    /// Vertical markers `(x, label)` (e.g. knees).
    pub vlines: Vec<(f64, String)>,
    /// Force the y range to start at 0 (linear axes).
    pub y_from_zero: bool,
}

/// A grouped bar chart: one group per category, one bar per series.
#[derive(Clone, Debug, Default)]
pub struct BarPlot {
    /// Title above the chart.
    pub title: String,
    /// Y axis caption.
    pub y_label: String,
    /// Group names along x.
    pub categories: Vec<String>,
    /// `(series name, value per category)`.
    pub series: Vec<(String, Vec<f64>)>,
    /// A horizontal reference line (e.g. 1.0 for normalised values).
    pub hline: Option<f64>,
}

/// One chart of a figure.
#[derive(Clone, Debug)]
pub enum Chart {
    /// Lines.
    Line(LinePlot),
    /// Bars.
    Bar(BarPlot),
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// Draws `charts` in a grid of `cols` columns, each panel `panel` pixels,
/// into `path` (`.png` or `.svg`).
pub fn render(
    charts: &[Chart],
    cols: usize,
    panel: (u32, u32),
    path: &Path,
) -> Result<(), SimError> {
    register_font()?;
    let cols = cols.max(1);
    let rows = charts.len().div_ceil(cols).max(1);
    let size = (panel.0 * cols as u32, panel.1 * rows as u32);
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| e.to_ascii_lowercase())
        .unwrap_or_default();
    let err = |e: String| SimError::Plot(format!("{}: {e}", path.display()));
    match ext.as_str() {
        "png" => {
            let root = BitMapBackend::new(path, size).into_drawing_area();
            draw_all(&root, charts, rows, cols).map_err(err)?;
            root.present().map_err(|e| err(e.to_string()))
        }
        "svg" => {
            let root = SVGBackend::new(path, size).into_drawing_area();
            draw_all(&root, charts, rows, cols).map_err(err)?;
            root.present().map_err(|e| err(e.to_string()))
        }
        _ => Err(err("unknown plot extension (use .png or .svg)".into())),
    }
}

fn draw_all<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    charts: &[Chart],
    rows: usize,
    cols: usize,
) -> Result<(), String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let areas = root.split_evenly((rows, cols));
    for (c, area) in charts.iter().zip(areas.iter()) {
        match c {
            Chart::Line(p) => draw_line(area, p)?,
            Chart::Bar(p) => draw_bar(area, p)?,
        }
    }
    Ok(())
}

fn range(vals: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in vals.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if from_zero {
        lo = lo.min(0.0);
    }
    if hi - lo < 1e-12 {
        let pad = if hi.abs() > 0.0 { hi.abs() * 0.1 } else { 1.0 };
        return (lo - pad, hi + pad);
    }
    let pad = (hi - lo) * 0.05;
    (if from_zero && lo >= 0.0 { lo } else { lo - pad }, hi + pad)
}

fn draw_line<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &LinePlot,
) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let xs = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|q| p.x_axis.fwd(q.0)))
        .chain(p.vlines.iter().map(|v| p.x_axis.fwd(v.0)));
    let (x0, x1) = range(xs, false);
    let from_zero = p.y_from_zero && matches!(p.y_axis, Axis::Linear | Axis::LinearBytes);
    let ys = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|q| p.y_axis.fwd(q.1)));
    let (y0, y1) = range(ys, from_zero);
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(e)?;
    let (xa, ya) = (p.x_axis, p.y_axis);
    chart
        .configure_mesh()
        .x_desc(p.x_label.as_str())
        .y_desc(p.y_label.as_str())
        .x_label_formatter(&|v| xa.label(*v))
        .y_label_formatter(&|v| ya.label(*v))
        .x_labels(8)
        .y_labels(8)
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(e)?;
    for (i, (x, label)) in p.vlines.iter().enumerate() {
        let x = xa.fwd(*x);
        // Stagger labels so that close markers stay readable.
        let ly = y1 - (y1 - y0) * (0.04 + 0.06 * (i % 4) as f64);
        let gray = RGBColor(110, 110, 110);
        chart
            .draw_series(DashedLineSeries::new(
                vec![(x, y0), (x, y1)],
                6,
                4,
                gray.stroke_width(1),
            ))
            .map_err(e)?;
        chart
            .draw_series(std::iter::once(Text::new(
                label.clone(),
                (x, ly),
                ("sans-serif", 12).into_font().color(&gray),
            )))
            .map_err(e)?;
    }
    for (i, s) in p.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .map(|&(x, y)| (xa.fwd(x), ya.fwd(y)))
            .filter(|q| q.0.is_finite() && q.1.is_finite())
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(e)?
            .label(s.name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart
            .draw_series(pts.iter().map(|&q| Circle::new(q, 3, color.filled())))
            .map_err(e)?;
    }
    if p.series.len() > 1 || p.series.first().is_some_and(|s| !s.name.is_empty()) {
        draw_legend(&mut chart)?;
    }
    Ok(())
}

/// The series' legend, upper right, as every plot draws it.
fn draw_legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| e.to_string())
}

fn draw_bar<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, p: &BarPlot) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let n = p.categories.len().max(1) as f64;
    let ys = p
        .series
        .iter()
        .flat_map(|s| s.1.iter().copied())
        .chain(p.hline);
    let (_, y1) = range(ys, true);
    let y1 = y1 * 1.08;
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..n, 0.0..y1)
        .map_err(e)?;
    let cats = p.categories.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(p.y_label.as_str())
        .x_labels(cats.len() * 2 + 1)
        .x_label_formatter(&|v| {
            let f = v - v.floor();
            if (f - 0.5).abs() < 0.01 {
                cats.get(v.floor() as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|v| num(*v))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(e)?;
    let k = p.series.len().max(1) as f64;
    let w = 0.8 / k;
    for (si, (name, vals)) in p.series.iter().enumerate() {
        let color = COLORS[si % COLORS.len()];
        chart
            .draw_series(vals.iter().enumerate().map(|(ci, &v)| {
                let x = ci as f64 + 0.1 + si as f64 * w;
                Rectangle::new([(x, 0.0), (x + w * 0.92, v.max(0.0))], color.filled())
            }))
            .map_err(e)?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        chart
            .draw_series(vals.iter().enumerate().map(|(ci, &v)| {
                let x = ci as f64 + 0.1 + si as f64 * w;
                Text::new(
                    num(v),
                    (x, v.max(0.0) + y1 * 0.01),
                    ("sans-serif", 11).into_font(),
                )
            }))
            .map_err(e)?;
    }
    if let Some(h) = p.hline {
        chart
            .draw_series(LineSeries::new(
                vec![(0.0, h), (n, h)],
                BLACK.mix(0.5).stroke_width(1),
            ))
            .map_err(e)?;
    }
    draw_legend(&mut chart)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_labels() {
        assert_eq!(Axis::Log2Bytes.label(20.0), "1M");
        assert_eq!(Axis::Log2Bytes.fwd(1024.0), 10.0);
        assert_eq!(Axis::Linear.label(12345.0), "12k");
        assert_eq!(Axis::Log10.label(2.0), "100");
    }
}
