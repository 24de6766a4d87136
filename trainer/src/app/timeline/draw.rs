//! The timeline's picture: laid out once as a list of rectangles, texts and lines in pixels,
//! then written either as SVG by hand or as PNG through plotters' bitmap backend.
//!
//! The SVG is written here rather than by plotters so that each span's rectangle carries a
//! class naming its category (`class="span cat-gemm"`) and a `<title>` (a browser shows the
//! span's name and duration on hover): a reader, or a test, can count and find spans. Both
//! formats are laid out with the embedded DejaVu subset's metrics (a label is drawn only
//! where it fits inside its span), so they place the same things in the same places.

use super::read::{Trace, CATEGORIES};
use crate::app::chart::{self, ChartError, FAMILY, PALETTE};
use plotters::backend::RGBPixel;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::fmt::Write as _;

pub type Rgb = (u8, u8, u8);

/// The profiler's categories' colours, in [`CATEGORIES`]' order: the step and layer spans,
/// which hold everything else, are pale so the ops inside them stand out; the ops take
/// Tableau's colours (the palette of `cannon plot`'s lines).
const CATEGORY_COLOURS: [Rgb; 11] = [
    (0xc7, 0xc7, 0xc7), // step
    (0xae, 0xc7, 0xe8), // layer
    PALETTE[0],         // gemm
    PALETTE[1],         // attention
    PALETTE[2],         // norm
    PALETTE[3],         // loss
    PALETTE[4],         // optimizer
    PALETTE[6],         // collective
    PALETTE[5],         // copy
    PALETTE[8],         // data
    PALETTE[9],         // eval
];

/// Categories this profiler does not write, in the order they are met: Tableau's light
/// colours, then reused.
const OTHER_COLOURS: [Rgb; 6] = [
    (0xff, 0xbb, 0x78),
    (0x98, 0xdf, 0x8a),
    (0xff, 0x98, 0x96),
    (0xc5, 0xb0, 0xd5),
    (0xdb, 0xdb, 0x8d),
    (0x9e, 0xda, 0xe5),
];

/// A category's colour; `cats` is the trace's categories (an unknown one's colour is by its
/// place among the unknown ones).
pub fn colour(cat: &str, cats: &[String]) -> Rgb {
    if let Some(i) = CATEGORIES.iter().position(|c| *c == cat) {
        return CATEGORY_COLOURS[i];
    }
    let other = cats
        .iter()
        .filter(|c| !CATEGORIES.contains(&c.as_str()))
        .position(|c| c == cat)
        .unwrap_or(0);
    OTHER_COLOURS[other % OTHER_COLOURS.len()]
}

/// `#RRGGBB`, upper case as plotters writes colours.
pub fn hex((r, g, b): Rgb) -> String {
    format!("#{r:02X}{g:02X}{b:02X}")
}

const DEFAULT_WIDTH: u32 = 1200;
const MARGIN: f64 = 12.0;
const TITLE_H: f64 = 30.0;
const TITLE_SIZE: f64 = 15.0;
/// Band labels, ticks and legend.
const TEXT_SIZE: f64 = 12.0;
/// Labels inside spans: small, but a row must be taller than this for them to be drawn.
const LABEL_SIZE: f64 = 11.0;
const ROW_H: f64 = 18.0;
const MAX_ROW_H: f64 = 40.0;
/// Space above and below a band's rows, and between bands.
const BAND_PAD: f64 = 4.0;
const BAND_GAP: f64 = 6.0;
const AXIS_H: f64 = 34.0;
const LEGEND_ROW_H: f64 = 20.0;
const SWATCH: f64 = 12.0;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Anchor {
    Left,
    Centre,
    Right,
}

/// One thing drawn, in pixels, in paint order.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Rect {
        x: f64,
        y: f64,
        w: f64,
        h: f64,
        fill: Rgb,
        /// A span's category and hover text; `None` for backgrounds and swatches.
        span: Option<(String, String)>,
    },
    Text {
        x: f64,
        /// The text's vertical centre.
        y: f64,
        text: String,
        size: f64,
        colour: Rgb,
        anchor: Anchor,
    },
    Line {
        from: (f64, f64),
        to: (f64, f64),
        colour: Rgb,
    },
}

/// DejaVu Sans' line height (ascent + descent) in ems. plotters' ab_glyph scales a font so
/// that this height is the size asked, while an SVG's `font-size` is the em: PNG text is drawn
/// (and all text measured) at `size * LINE_EM` so that both formats' text is the same size.
const LINE_EM: f64 = 1.164;

/// How wide `text` is at `size` (an SVG font size) in the embedded font (registered by the
/// caller); an estimate if the font cannot lay it out, which only decides whether a label fits.
fn text_width(text: &str, size: f64) -> f64 {
    FontDesc::new(FontFamily::Name(FAMILY), size * LINE_EM, FontStyle::Normal)
        .box_size(text)
        .map(|(w, _)| f64::from(w))
        .unwrap_or(size * 0.6 * text.len() as f64)
}

/// Black text on light fills, white on dark ones.
fn ink((r, g, b): Rgb) -> Rgb {
    let luma = 0.299 * f64::from(r) + 0.587 * f64::from(g) + 0.114 * f64::from(b);
    if luma > 150.0 {
        (0x20, 0x20, 0x20)
    } else {
        (0xff, 0xff, 0xff)
    }
}

/// A tick spacing of 1, 2 or 5 times a power of ten giving about `target` ticks over
/// `0..range`, and the decimals its labels need.
pub fn tick_step(range: f64, target: usize) -> (f64, usize) {
    let raw = (range / target.max(1) as f64).max(1e-9);
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|k| k * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let decimals = (-step.log10().floor()).clamp(0.0, 6.0) as usize;
    (step, decimals)
}

/// Lays `trace` out at `size` (or the default: 1200 wide, as tall as its rows need) and
/// returns what to draw and the picture's size.
pub fn layout(trace: &Trace, size: Option<(u32, u32)>) -> (Vec<Item>, (u32, u32)) {
    let cats = trace.categories();
    let width = f64::from(size.map_or(DEFAULT_WIDTH, |s| s.0));
    let label_col = trace
        .tracks
        .iter()
        .map(|t| text_width(&t.label, TEXT_SIZE))
        .fold(60.0, f64::max)
        .min(width / 3.0)
        + 16.0;
    let (x0, x1) = (MARGIN + label_col, width - MARGIN);

    // The legend, wrapped to the width: (x offset, row) per category.
    let mut legend = Vec::new();
    let (mut lx, mut lrow) = (0.0, 0usize);
    for c in &cats {
        let w = SWATCH + 4.0 + text_width(c, TEXT_SIZE) + 18.0;
        if lx > 0.0 && MARGIN + lx + w > width - MARGIN {
            lx = 0.0;
            lrow += 1;
        }
        legend.push((c, lx, lrow));
        lx += w;
    }
    let legend_h = (lrow + 1) as f64 * LEGEND_ROW_H;

    let bands = trace.tracks.len() as f64;
    let rows: usize = trace.tracks.iter().map(|t| t.rows).sum();
    let fixed = 2.0 * MARGIN
        + TITLE_H
        + bands * 2.0 * BAND_PAD
        + (bands - 1.0).max(0.0) * BAND_GAP
        + AXIS_H
        + legend_h;
    let rows_f = rows.max(1) as f64;
    let (row_h, height) = match size {
        Some((_, h)) => (
            ((f64::from(h) - fixed) / rows_f).clamp(1.0, MAX_ROW_H),
            f64::from(h),
        ),
        None => {
            let max = f64::from(chart::MAX_SIDE);
            let row_h = if fixed + rows_f * ROW_H > max {
                ((max - fixed) / rows_f).max(1.0)
            } else {
                ROW_H
            };
            let h = (fixed + rows_f * row_h).clamp(f64::from(chart::MIN_SIDE), max);
            (row_h, h.ceil())
        }
    };

    let mut items = Vec::new();
    let text = |x, y, text: String, size, anchor| Item::Text {
        x,
        y,
        text,
        size,
        colour: (0x20, 0x20, 0x20),
        anchor,
    };
    let file = trace.path.file_name().map_or_else(
        || trace.path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    items.push(text(
        MARGIN,
        MARGIN + TITLE_H / 2.0 - 4.0,
        format!(
            "{file}: {} spans on {} track{} over {:.2} ms, timed from the first span",
            trace.span_count(),
            trace.tracks.len(),
            if trace.tracks.len() == 1 { "" } else { "s" },
            trace.end_ms
        ),
        TITLE_SIZE,
        Anchor::Left,
    ));

    // Band backgrounds and labels; then the grid over them; then the spans over the grid.
    let top = MARGIN + TITLE_H;
    let mut band_y = Vec::new();
    let mut y = top;
    for (i, t) in trace.tracks.iter().enumerate() {
        let h = t.rows as f64 * row_h + 2.0 * BAND_PAD;
        items.push(Item::Rect {
            x: MARGIN,
            y,
            w: width - 2.0 * MARGIN,
            h,
            fill: if i % 2 == 0 {
                (0xf3, 0xf3, 0xf3)
            } else {
                (0xfa, 0xfa, 0xfa)
            },
            span: None,
        });
        items.push(text(
            MARGIN + 6.0,
            y + BAND_PAD + row_h.max(TEXT_SIZE) / 2.0,
            t.label.clone(),
            TEXT_SIZE,
            Anchor::Left,
        ));
        band_y.push(y + BAND_PAD);
        y += h + BAND_GAP;
    }
    let bottom = y - BAND_GAP;

    let span_ms = trace.end_ms.max(1e-6);
    let scale = (x1 - x0) / span_ms;
    let (step, decimals) = tick_step(span_ms, ((x1 - x0) / 90.0).max(2.0) as usize);
    let ticks: Vec<f64> = (0..)
        .map(|k| f64::from(k) * step)
        .take_while(|t| *t <= span_ms * (1.0 + 1e-9))
        .take(1000)
        .collect();
    for &t in &ticks {
        let x = x0 + t * scale;
        items.push(Item::Line {
            from: (x, top),
            to: (x, bottom),
            colour: (0xdd, 0xdd, 0xdd),
        });
    }

    for (t, &by) in trace.tracks.iter().zip(&band_y) {
        for s in &t.spans {
            let fill = colour(&s.cat, &cats);
            // A pixel's gap after a wide span keeps neighbours of one colour apart.
            let full = s.dur_ms * scale;
            let w = if full > 3.0 {
                full - 1.0
            } else {
                full.max(0.6)
            };
            let x = x0 + s.start_ms * scale;
            let y = by + s.depth as f64 * row_h;
            let h = if row_h >= 4.0 { row_h - 1.0 } else { row_h };
            items.push(Item::Rect {
                x,
                y,
                w,
                h,
                fill,
                span: Some((
                    s.cat.clone(),
                    format!("{} ({}): {:.3} ms", s.name, s.cat, s.dur_ms),
                )),
            });
            // 8 px of slack: a viewer without DejaVu Sans substitutes a slightly wider font.
            if h >= LABEL_SIZE + 2.0 && text_width(&s.name, LABEL_SIZE) + 3.0 + 8.0 <= w {
                items.push(Item::Text {
                    x: x + 3.0,
                    y: y + h / 2.0,
                    text: s.name.clone(),
                    size: LABEL_SIZE,
                    colour: ink(fill),
                    anchor: Anchor::Left,
                });
            }
        }
    }

    // The time axis under the bands.
    let axis = (bottom + 4.0).round();
    items.push(Item::Line {
        from: (x0, axis),
        to: (x1, axis),
        colour: (0x60, 0x60, 0x60),
    });
    for &t in &ticks {
        let x = x0 + t * scale;
        items.push(Item::Line {
            from: (x, axis),
            to: (x, axis + 4.0),
            colour: (0x60, 0x60, 0x60),
        });
        items.push(text(
            x,
            axis + 13.0,
            format!("{t:.decimals$}"),
            TEXT_SIZE,
            Anchor::Centre,
        ));
    }
    // Short, to stay in the label column left of the first tick; the title says from when.
    items.push(text(
        MARGIN + 6.0,
        axis + 13.0,
        "time (ms)".into(),
        TEXT_SIZE,
        Anchor::Left,
    ));

    let legend_top = axis + AXIS_H - 4.0;
    for (c, lx, row) in legend {
        let ly = legend_top + row as f64 * LEGEND_ROW_H;
        items.push(Item::Rect {
            x: MARGIN + lx,
            y: ly,
            w: SWATCH,
            h: SWATCH,
            fill: colour(c, &cats),
            span: None,
        });
        items.push(text(
            MARGIN + lx + SWATCH + 4.0,
            ly + SWATCH / 2.0,
            c.clone(),
            TEXT_SIZE,
            Anchor::Left,
        ));
    }
    (items, (width as u32, height as u32))
}

/// `s` with XML's special characters escaped.
fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // XML 1.0 allows no other control characters.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// A category as a class name: letters, digits, `-` and `_` kept, anything else `_`.
fn class_name(cat: &str) -> String {
    cat.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The SVG document of `items`.
pub fn svg(items: &[Item], (w, h): (u32, u32)) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail: the results are ignored.
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         viewBox=\"0 0 {w} {h}\" font-family=\"DejaVu Sans, Verdana, sans-serif\">"
    );
    let _ = writeln!(out, "<rect width=\"{w}\" height=\"{h}\" fill=\"#FFFFFF\"/>");
    for item in items {
        let _ = match item {
            Item::Rect {
                x,
                y,
                w,
                h,
                fill,
                span: Some((cat, title)),
            } => writeln!(
                out,
                "<rect class=\"span cat-{}\" x=\"{x:.2}\" y=\"{y:.2}\" width=\"{w:.2}\" \
                 height=\"{h:.2}\" fill=\"{}\"><title>{}</title></rect>",
                class_name(cat),
                hex(*fill),
                xml(title)
            ),
            Item::Rect {
                x,
                y,
                w,
                h,
                fill,
                span: None,
            } => writeln!(
                out,
                "<rect x=\"{x:.2}\" y=\"{y:.2}\" width=\"{w:.2}\" height=\"{h:.2}\" \
                 fill=\"{}\"/>",
                hex(*fill)
            ),
            Item::Text {
                x,
                y,
                text,
                size,
                colour,
                anchor,
            } => {
                let anchor = match anchor {
                    Anchor::Left => "start",
                    Anchor::Centre => "middle",
                    Anchor::Right => "end",
                };
                // A baseline 0.35 em under the centre: dominant-baseline is not read by
                // every renderer.
                writeln!(
                    out,
                    "<text x=\"{x:.2}\" y=\"{:.2}\" font-size=\"{size}\" fill=\"{}\" \
                     text-anchor=\"{anchor}\">{}</text>",
                    y + size * 0.35,
                    hex(*colour),
                    xml(text)
                )
            }
            Item::Line { from, to, colour } => writeln!(
                out,
                "<line x1=\"{:.2}\" y1=\"{:.2}\" x2=\"{:.2}\" y2=\"{:.2}\" stroke=\"{}\" \
                 stroke-width=\"1\"/>",
                from.0,
                from.1,
                to.0,
                to.1,
                hex(*colour)
            ),
        };
    }
    out.push_str("</svg>\n");
    out
}

/// `items` rasterised into an RGB buffer of `size` through plotters (text from the embedded
/// font, registered by the caller).
pub fn pixels(items: &[Item], size: (u32, u32)) -> Result<Vec<u8>, ChartError> {
    let (w, h) = size;
    let mut rgb = vec![0u8; (w as usize) * (h as usize) * 3];
    {
        let backend = BitMapBackend::<RGBPixel>::with_buffer_and_format(&mut rgb, size)
            .map_err(|e| ChartError::Draw(e.to_string()))?;
        let root = backend.into_drawing_area();
        root.fill(&WHITE).map_err(chart::draw_err)?;
        let px = |v: f64| v.round() as i32;
        for item in items {
            match item {
                Item::Rect {
                    x, y, w, h, fill, ..
                } => {
                    let (x0, y0) = (px(*x), px(*y));
                    // plotters fills both corners' pixels: the far corner is one less, and a
                    // thin span keeps one pixel column.
                    let x1 = (px(x + w) - 1).max(x0);
                    let y1 = (px(y + h) - 1).max(y0);
                    let (r, g, b) = *fill;
                    root.draw(&Rectangle::new(
                        [(x0, y0), (x1, y1)],
                        RGBColor(r, g, b).filled(),
                    ))
                    .map_err(chart::draw_err)?;
                }
                Item::Text {
                    x,
                    y,
                    text,
                    size,
                    colour: (r, g, b),
                    anchor,
                } => {
                    let h = match anchor {
                        Anchor::Left => HPos::Left,
                        Anchor::Centre => HPos::Center,
                        Anchor::Right => HPos::Right,
                    };
                    let style = (FAMILY, size * LINE_EM)
                        .into_font()
                        .color(&RGBColor(*r, *g, *b))
                        .pos(Pos::new(h, VPos::Center));
                    root.draw(&Text::new(text.as_str(), (px(*x), px(*y)), style))
                        .map_err(chart::draw_err)?;
                }
                Item::Line {
                    from,
                    to,
                    colour: (r, g, b),
                } => {
                    root.draw(&PathElement::new(
                        vec![(px(from.0), px(from.1)), (px(to.0), px(to.1))],
                        RGBColor(*r, *g, *b).stroke_width(1),
                    ))
                    .map_err(chart::draw_err)?;
                }
            }
        }
        root.present().map_err(chart::draw_err)?;
    }
    Ok(rgb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(tick_step(100.0, 10), (10.0, 0));
        assert_eq!(tick_step(13.0, 10), (2.0, 0));
        assert_eq!(tick_step(0.9, 10), (0.1, 1));
        assert_eq!(tick_step(2400.0, 12), (200.0, 0));
    }

    #[test]
    fn categories_have_their_own_colours() {
        let cats: Vec<String> = ["gemm", "zeta", "alpha"].map(String::from).to_vec();
        assert_eq!(colour("gemm", &cats), PALETTE[0]);
        assert_eq!(colour("zeta", &cats), OTHER_COLOURS[0]);
        assert_eq!(colour("alpha", &cats), OTHER_COLOURS[1]);
        let all: std::collections::HashSet<Rgb> = CATEGORY_COLOURS.into_iter().collect();
        assert_eq!(all.len(), CATEGORY_COLOURS.len());
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(xml("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
        assert_eq!(class_name("all gather/x"), "all_gather_x");
    }
}
