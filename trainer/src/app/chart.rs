//! Line charts of training metrics as SVG or PNG, for `cannon plot` and `cannon compare --plot`.
//!
//! A [`Figure`] is a column of panels that share one x range (the step), each with its own y
//! range, one coloured line per series and a legend. The drawing is plotters'; this module
//! only lays the panels out and keeps the choices in one place: the palette, a faint raw line
//! under a smoothed one, skipped steps as crosses on a panel's bottom edge.
//!
//! PNG text needs glyph outlines. plotters finds system fonts through fontconfig by default,
//! which a bare server lacks; here its ab_glyph backend draws with an ASCII subset of DejaVu
//! Sans built into the binary (`trainer/assets/fonts`), so a PNG renders the same on any host.

use plotters::backend::RGBPixel;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// The font every label is drawn with (ab_glyph reads it in place: it must be `'static`).
static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans-ascii.ttf");
pub(crate) const FAMILY: &str = "sans-serif";

/// Tableau's ten colours: distinct for the usual handful of runs and common in plots people
/// already read. Series past the tenth reuse them in order.
pub const PALETTE: [(u8, u8, u8); 10] = [
    (0x1f, 0x77, 0xb4),
    (0xff, 0x7f, 0x0e),
    (0x2c, 0xa0, 0x2c),
    (0xd6, 0x27, 0x28),
    (0x94, 0x67, 0xbd),
    (0x8c, 0x56, 0x4b),
    (0xe3, 0x77, 0xc2),
    (0x7f, 0x7f, 0x7f),
    (0xbc, 0xbd, 0x22),
    (0x17, 0xbe, 0xcf),
];

/// The opacity of the raw line drawn under a smoothed one: visible, but not competing.
pub const RAW_OPACITY: f64 = 0.25;

/// One run's (or one difference's) points in a panel.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// The legend's text.
    pub name: String,
    /// Index into [`PALETTE`] (wrapped).
    pub colour: usize,
    /// `(step, value)`, finite, ascending by step.
    pub points: Vec<(f64, f64)>,
    /// A smoothed copy of `points`, drawn solid over `points` drawn faint; `None`: `points`
    /// are drawn solid.
    pub smoothed: Option<Vec<(f64, f64)>>,
    /// Steps the run skipped (not applied): crosses on the panel's bottom edge.
    pub skipped: Vec<f64>,
    /// A dot at each point: sparse series (evals) whose points matter more than the line.
    pub dots: bool,
}

impl Series {
    pub fn rgb(&self) -> RGBColor {
        let (r, g, b) = PALETTE[self.colour % PALETTE.len()];
        RGBColor(r, g, b)
    }
}

/// One chart of the column.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// The caption and the y axis' label.
    pub title: String,
    pub series: Vec<Series>,
}

/// A column of panels sharing the x axis.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub panels: Vec<Panel>,
    /// The shared x range (steps).
    pub x: (f64, f64),
}

/// What the output file is, from its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Svg,
    Png,
}

impl Format {
    /// `.svg` or `.png` (any case).
    pub fn of(path: &Path) -> Result<Self, ChartError> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("svg") => Ok(Format::Svg),
            Some("png") => Ok(Format::Png),
            _ => Err(ChartError::Extension(path.to_path_buf())),
        }
    }
}

/// The default size: wide enough for a few thousand steps to read, each panel tall enough
/// for its ticks.
pub fn default_size(panels: usize) -> (u32, u32) {
    let panels = u32::try_from(panels.max(1)).unwrap_or(u32::MAX);
    (1000, 340u32.saturating_mul(panels).saturating_add(20))
}

/// The sides accepted for `--size`: a chart needs room for its axes, and the PNG buffer
/// (3 bytes a pixel) stays under 200 MB.
pub const MIN_SIDE: u32 = 200;
pub const MAX_SIDE: u32 = 8000;

/// Why a chart was not written.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    #[error("{0}: unsupported output extension (use .svg or .png)")]
    Extension(PathBuf),
    #[error("the chart has no panel")]
    Empty,
    #[error("{w}x{h}: each side must be in {MIN_SIDE}..={MAX_SIDE} pixels")]
    Size { w: u32, h: u32 },
    #[error("the embedded font does not parse")]
    Font,
    #[error("drawing the chart: {0}")]
    Draw(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: encoding the PNG: {reason}")]
    Png { path: PathBuf, reason: String },
}

pub(crate) fn draw_err<E: std::error::Error + Send + Sync>(
    e: DrawingAreaErrorKind<E>,
) -> ChartError {
    ChartError::Draw(e.to_string())
}

/// Draws `fig` to `path` (SVG or PNG by its extension) at `size` pixels.
pub fn write(fig: &Figure, path: &Path, size: (u32, u32)) -> Result<(), ChartError> {
    let format = Format::of(path)?;
    let (w, h) = size;
    if !(MIN_SIDE..=MAX_SIDE).contains(&w) || !(MIN_SIDE..=MAX_SIDE).contains(&h) {
        return Err(ChartError::Size { w, h });
    }
    if fig.panels.is_empty() {
        return Err(ChartError::Empty);
    }
    // The SVG is laid out with the same font's metrics, so both formats place text alike.
    register_font()?;
    let io = |source| ChartError::Io {
        path: path.to_path_buf(),
        source,
    };
    match format {
        Format::Svg => {
            let mut svg = String::new();
            {
                let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
                draw(fig, &root)?;
                root.present().map_err(draw_err)?;
            }
            std::fs::write(path, svg).map_err(io)
        }
        Format::Png => {
            let len = (w as usize) * (h as usize) * 3;
            let mut rgb = vec![0u8; len];
            {
                let backend = BitMapBackend::<RGBPixel>::with_buffer_and_format(&mut rgb, size)
                    .map_err(|e| ChartError::Draw(e.to_string()))?;
                let root = backend.into_drawing_area();
                draw(fig, &root)?;
                root.present().map_err(draw_err)?;
            }
            save_png(path, size, rgb)
        }
    }
}

/// Encodes `rgb` (3 bytes a pixel, rows top to bottom) as the PNG `path`, with the `image`
/// crate rather than plotters' own older encoder.
pub(crate) fn save_png(path: &Path, (w, h): (u32, u32), rgb: Vec<u8>) -> Result<(), ChartError> {
    let io = |source| ChartError::Io {
        path: path.to_path_buf(),
        source,
    };
    let png = |reason: String| ChartError::Png {
        path: path.to_path_buf(),
        reason,
    };
    let img = image::RgbImage::from_raw(w, h, rgb)
        .ok_or_else(|| png("the pixel buffer does not match the size".into()))?;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
    img.write_to(&mut out, image::ImageFormat::Png)
        .map_err(|e| png(e.to_string()))?;
    std::io::Write::flush(&mut out).map_err(io)
}

/// Registers the embedded font under the family names plotters may ask for; registering
/// again only replaces the entry.
pub(crate) fn register_font() -> Result<(), ChartError> {
    for family in [FAMILY, "serif", "monospace"] {
        plotters::style::register_font(family, FontStyle::Normal, FONT)
            .map_err(|_| ChartError::Font)?;
    }
    Ok(())
}

/// `lo..hi` widened by 5 % each side, and to a unit span around a flat line, so that no line
/// sits on the frame and plotters never gets an empty range.
fn padded(lo: f64, hi: f64) -> (f64, f64) {
    if !(lo.is_finite() && hi.is_finite()) {
        return (0.0, 1.0);
    }
    let span = hi - lo;
    if span <= f64::EPSILON * hi.abs().max(lo.abs()).max(1.0) {
        let pad = (hi.abs() * 0.05).max(0.5);
        return (lo - pad, hi + pad);
    }
    (lo - span * 0.05, hi + span * 0.05)
}

fn draw<DB: DrawingBackend>(fig: &Figure, root: &DrawingArea<DB, Shift>) -> Result<(), ChartError>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(draw_err)?;
    let areas = root.split_evenly((fig.panels.len(), 1));
    let (x0, x1) = padded(fig.x.0, fig.x.1);
    for (area, panel) in areas.iter().zip(&fig.panels) {
        draw_panel(area, panel, (x0, x1))?;
    }
    Ok(())
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel: &Panel,
    x: (f64, f64),
) -> Result<(), ChartError>
where
    DB::ErrorType: 'static,
{
    let values = panel.series.iter().flat_map(|s| {
        s.points
            .iter()
            .chain(s.smoothed.iter().flatten())
            .map(|p| p.1)
    });
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let (y0, y1) = padded(lo, hi);
    let ticks = TickFormat::new(y0, y1);
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, (FAMILY, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x.0..x.1, y0..y1)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc(&panel.title)
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 14))
        .light_line_style(WHITE.mix(0.0))
        .bold_line_style(BLACK.mix(0.08))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| ticks.label(*v))
        .draw()
        .map_err(draw_err)?;
    for s in &panel.series {
        let colour = s.rgb();
        let solid = match &s.smoothed {
            Some(smooth) => {
                chart
                    .draw_series(LineSeries::new(
                        s.points.iter().copied(),
                        colour.mix(RAW_OPACITY).stroke_width(1),
                    ))
                    .map_err(draw_err)?;
                smooth
            }
            None => &s.points,
        };
        // A lone point draws no line: give it a dot.
        let dot = if s.dots || solid.len() < 2 { 3 } else { 0 };
        chart
            .draw_series(
                LineSeries::new(solid.iter().copied(), colour.stroke_width(2)).point_size(dot),
            )
            .map_err(draw_err)?
            .label(s.name.as_str())
            .legend(move |(lx, ly)| {
                Rectangle::new([(lx, ly - 4), (lx + 14, ly + 4)], colour.filled())
            });
        chart
            .draw_series(
                s.skipped
                    .iter()
                    .map(|&step| Cross::new((step, y0), 4, colour.stroke_width(1))),
            )
            .map_err(draw_err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FAMILY, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

/// How a panel's y ticks are written: one style for the whole axis (so 0.003 and 5e-4 do not
/// sit on one axis in two notations), with as many decimals as the tick spacing needs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum TickFormat {
    Exponent,
    Decimals(usize),
}

impl TickFormat {
    fn new(lo: f64, hi: f64) -> Self {
        let big = lo.abs().max(hi.abs());
        if !(1e-2..1e5).contains(&big) {
            return TickFormat::Exponent;
        }
        // About ten ticks a panel: one more decimal than their spacing's first digit needs.
        let spacing = ((hi - lo) / 10.0).max(f64::MIN_POSITIVE);
        TickFormat::Decimals((1.0 - spacing.log10().floor()).clamp(0.0, 6.0) as usize)
    }

    fn label(self, v: f64) -> String {
        match self {
            _ if v == 0.0 => "0".into(),
            TickFormat::Exponent => format!("{v:.2e}"),
            TickFormat::Decimals(d) => format!("{v:.d$}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_never_empty() {
        assert_eq!(padded(2.0, 2.0), (1.5, 2.5));
        assert_eq!(padded(f64::INFINITY, f64::NEG_INFINITY), (0.0, 1.0));
        let (a, b) = padded(0.0, 10.0);
        assert!(a < 0.0 && b > 10.0);
    }

    #[test]
    fn tick_labels_share_one_style() {
        let loss = TickFormat::new(0.8, 5.0);
        assert_eq!(loss, TickFormat::Decimals(2));
        assert_eq!(
            (loss.label(4.5), loss.label(0.0)),
            ("4.50".into(), "0".into())
        );
        let ms = TickFormat::new(700.0, 2500.0);
        assert_eq!(ms.label(800.0), "800");
        let lr = TickFormat::new(0.0, 0.003);
        assert_eq!(
            (lr.label(3e-3), lr.label(5e-4)),
            ("3.00e-3".into(), "5.00e-4".into())
        );
    }

    #[test]
    fn the_format_is_the_extension() {
        assert_eq!(Format::of(Path::new("a/b.SVG")).ok(), Some(Format::Svg));
        assert_eq!(Format::of(Path::new("b.png")).ok(), Some(Format::Png));
        assert!(Format::of(Path::new("b.pdf")).is_err());
        assert!(Format::of(Path::new("b")).is_err());
    }
}
