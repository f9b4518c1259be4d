//! One chart: axes and ticks, markers and lines, the native reference, and the figure headings.

use std::ops::Range;

use anyhow::Result;
use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::font::{fit_font, FONT_FAMILY};
use super::style::{Line, Marker, ModeStyle, AXIS, GRID, REFERENCE, SUBTLE_TEXT, TEXT};

pub(super) const X_DESC: &str = "local memory (% of the native peak)";
pub(super) const Y_DESC: &str = "throughput normalized to native";

// ---------------------------------------------------------------------------------------------
// Axes

pub(super) struct Axes {
    pub(super) x: Range<f64>,
    pub(super) y: Range<f64>,
    x_ticks: Vec<f64>,
}

pub(super) const STANDARD_X_TICKS: [f64; 5] = [0.0, 25.0, 50.0, 75.0, 100.0];

pub(super) fn axes(lines: &[Line], min_tick_gap: f64) -> Axes {
    let xs: Vec<f64> = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .collect();
    let ys: Vec<f64> = lines
        .iter()
        .flat_map(|l| l.points.iter().filter_map(|p| p.1))
        .collect();
    let x = xs.iter().fold(0.0_f64, |a, &b| a.min(b))..xs.iter().fold(100.0_f64, |a, &b| a.max(b));
    let y_max = ys.iter().fold(1.1_f64, |a, &b| a.max(1.05 * b));
    let y_min = ys.iter().fold(0.0_f64, |a, &b| a.min(1.05 * b));
    let x_ticks = x_ticks(&xs, &x, min_tick_gap);
    // 1.05 × a huge finite value can overflow to infinity, which plotters cannot map.
    let y = y_min.max(f64::MIN / 2.0)..y_max.min(f64::MAX / 2.0);
    Axes { x, y, x_ticks }
}

/// Ticks at the measured percentages, plus the quarter marks; whichever comes later is dropped
/// when two would be closer than `min_gap` (a fraction of the axis) and their labels collide.
pub(super) fn x_ticks(xs: &[f64], range: &Range<f64>, min_gap: f64) -> Vec<f64> {
    let mut data = xs.to_vec();
    data.sort_by(f64::total_cmp);
    data.dedup();
    let gap = (range.end - range.start) * min_gap;
    let mut ticks: Vec<f64> = Vec::new();
    for t in data.into_iter().chain(STANDARD_X_TICKS) {
        if ticks.iter().all(|u| (u - t).abs() >= gap) {
            ticks.push(t);
        }
    }
    ticks.sort_by(f64::total_cmp);
    ticks
}

/// Labels as short as the axis allows: plain ratios get one decimal, wild outliers (an axis
/// reaching far beyond native) integers or scientific notation so labels stay narrow.
pub(super) fn format_y(value: f64, axis_top: f64) -> String {
    if axis_top <= 20.0 {
        format!("{value:.1}")
    } else if axis_top <= 1e5 {
        format!("{value:.0}")
    } else {
        format!("{value:.1e}")
    }
}

/// A linear axis with ticks exactly where we want them. plotters' `with_key_points` would do,
/// but for f64 it loses the label formatter that `configure_mesh` requires.
struct TickedAxis {
    linear: RangedCoordf64,
    ticks: Vec<f64>,
}

impl Ranged for TickedAxis {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;

    fn range(&self) -> Range<f64> {
        self.linear.range()
    }

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.linear.map(value, limit)
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        // Grid lines only at the labelled ticks; no unlabelled "light" lines in between.
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }
}

impl ValueFormatter<f64> for TickedAxis {
    fn format(value: &f64) -> String {
        if value.fract() == 0.0 {
            format!("{value:.0}")
        } else {
            format!("{value:.1}")
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Drawing primitives

pub(super) fn text_style(size: u32, color: RGBColor, h: HPos, v: VPos) -> TextStyle<'static> {
    (FONT_FAMILY, size)
        .into_font()
        .color(&color)
        .pos(Pos::new(h, v))
}

/// Vertices of the polygon markers, relative to the data point; None for the circle.
fn marker_outline(marker: Marker, r: i32) -> Option<Vec<(i32, i32)>> {
    // Squares and diamonds look bigger than a circle of the same radius; shrink them a bit.
    let s = r * 4 / 5;
    match marker {
        Marker::Circle => None,
        Marker::Square => Some(vec![(-s, -s), (s, -s), (s, s), (-s, s)]),
        Marker::Diamond => Some(vec![(0, -r), (r, 0), (0, r), (-r, 0)]),
        Marker::Triangle => Some(vec![(0, -r - 1), (r, r * 3 / 4), (-r, r * 3 / 4)]),
    }
}

/// Draws a mode's marker at `at`, which may be a data point or a pixel position.
pub(super) fn draw_marker<DB, CT>(
    area: &DrawingArea<DB, CT>,
    at: CT::From,
    style: ModeStyle,
    r: i32,
) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    CT: CoordTranslate,
    CT::From: Clone,
{
    // Hollow markers get a white core so the line does not show through them.
    let (fill, outline) = if style.hollow {
        (WHITE.filled(), Some(style.color.stroke_width(2)))
    } else {
        (style.color.filled(), None)
    };
    let base = || EmptyElement::at(at.clone());
    match marker_outline(style.marker, r) {
        None => {
            area.draw(&(base() + Circle::new((0, 0), r, fill)))?;
            if let Some(stroke) = outline {
                area.draw(&(base() + Circle::new((0, 0), r, stroke)))?;
            }
        }
        Some(mut vertices) => {
            area.draw(&(base() + Polygon::new(vertices.clone(), fill)))?;
            if let Some(stroke) = outline {
                vertices.push(vertices[0]);
                area.draw(&(base() + PathElement::new(vertices, stroke)))?;
            }
        }
    }
    Ok(())
}

pub(super) fn draw_path<DB, CT>(
    area: &DrawingArea<DB, CT>,
    points: Vec<CT::From>,
    dashed: bool,
    style: ShapeStyle,
) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    CT: CoordTranslate,
    CT::From: Clone,
{
    if dashed {
        area.draw(&DashedPathElement::new(points, 7, 4, style))?;
    } else {
        area.draw(&PathElement::new(points, style))?;
    }
    Ok(())
}

pub(super) fn draw_dnf_marker<DB, CT>(
    area: &DrawingArea<DB, CT>,
    at: CT::From,
    dx: i32,
    color: RGBColor,
    r: i32,
) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    CT: CoordTranslate,
    CT::From: Clone,
{
    area.draw(&(EmptyElement::at(at) + Cross::new((dx, 0), r, color.stroke_width(2))))?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Charts

/// What differs between a full-size workload chart and an overview panel.
pub(super) struct Scale {
    tick_font: u32,
    desc_font: u32,
    marker: i32,
    x_label_area: u32,
    pub(super) y_label_area: u32,
    /// Room right of the plot for the "native" label of the reference line.
    pub(super) right_margin: u32,
    /// Minimum distance between x ticks, as a fraction of the axis.
    min_tick_gap: f64,
    y_labels: usize,
}

pub(super) const WORKLOAD_SCALE: Scale = Scale {
    tick_font: 15,
    desc_font: 16,
    marker: 5,
    x_label_area: 52,
    y_label_area: 72,
    right_margin: 70,
    min_tick_gap: 0.04,
    y_labels: 12,
};

pub(super) const PANEL_SCALE: Scale = Scale {
    tick_font: 14,
    desc_font: 15,
    marker: 4,
    x_label_area: 48,
    y_label_area: 66,
    right_margin: 64,
    min_tick_gap: 0.06,
    y_labels: 8,
};

/// Which axis descriptions a chart shows: small multiples only label the outer edges.
#[derive(Clone, Copy)]
pub(super) struct AxisDesc {
    pub(super) x: bool,
    pub(super) y: bool,
}

pub(super) fn draw_chart<DB>(
    area: &DrawingArea<DB, Shift>,
    lines: &[Line],
    scale: &Scale,
    desc: AxisDesc,
) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
{
    let axes = axes(lines, scale.min_tick_gap);
    let x_coord = TickedAxis {
        linear: axes.x.clone().into(),
        ticks: axes.x_ticks,
    };
    let mut chart = ChartBuilder::on(area)
        .margin_top(10)
        .margin_left(6)
        .margin_bottom(4)
        .margin_right(scale.right_margin)
        .x_label_area_size(scale.x_label_area)
        .y_label_area_size(scale.y_label_area)
        .build_cartesian_2d(x_coord, axes.y.clone())?;

    let y_top = axes.y.end;
    let format_y = |v: &f64| format_y(*v, y_top);
    let mut mesh = chart.configure_mesh();
    mesh.light_line_style(TRANSPARENT)
        .bold_line_style(GRID)
        .axis_style(AXIS)
        .y_labels(scale.y_labels)
        .y_label_formatter(&format_y)
        .label_style((FONT_FAMILY, scale.tick_font).into_font().color(&TEXT))
        .axis_desc_style((FONT_FAMILY, scale.desc_font).into_font().color(&TEXT));
    if desc.x {
        mesh.x_desc(X_DESC);
    }
    if desc.y {
        mesh.y_desc(Y_DESC);
    }
    mesh.draw()?;

    let plot = chart.plotting_area();
    draw_native_reference(plot, &axes.x, scale)?;
    for line in lines {
        draw_line(plot, line, scale)?;
    }
    draw_unfinished(plot, lines, scale)?;
    if lines.iter().all(|l| l.points.is_empty()) {
        let center = (
            (axes.x.start + axes.x.end) / 2.0,
            (axes.y.start + axes.y.end) / 2.0,
        );
        let note = text_style(scale.desc_font, SUBTLE_TEXT, HPos::Center, VPos::Center);
        plot.draw(&Text::new("no data", center, note))?;
    }
    Ok(())
}

/// The dashed line at 1.0, labelled just right of the plot where no data can hide it.
fn draw_native_reference<DB, CT>(
    plot: &DrawingArea<DB, CT>,
    x: &Range<f64>,
    scale: &Scale,
) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    CT: CoordTranslate<From = (f64, f64)>,
{
    let style = REFERENCE.stroke_width(1);
    plot.draw(&DashedPathElement::new(
        vec![(x.start, 1.0), (x.end, 1.0)],
        10,
        6,
        style,
    ))?;
    let label = text_style(scale.tick_font, REFERENCE, HPos::Left, VPos::Center);
    // Far enough right to clear the markers of points at the right edge.
    let dx = scale.marker + 8;
    plot.draw(&(EmptyElement::at((x.end, 1.0)) + Text::new("native", (dx, 0), label)))?;
    Ok(())
}

fn draw_line<DB, CT>(plot: &DrawingArea<DB, CT>, line: &Line, scale: &Scale) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    CT: CoordTranslate<From = (f64, f64)>,
{
    let stroke = line.style.color.stroke_width(2);
    for run in line.runs() {
        draw_path(plot, run.clone(), line.style.dashed, stroke)?;
        for point in run {
            draw_marker(plot, point, line.style, scale.marker)?;
        }
    }
    Ok(())
}

/// Crosses at y = 0 for runs that did not finish. Where several modes failed at the same x,
/// the crosses are spread sideways so each stays visible.
fn draw_unfinished<DB, CT>(plot: &DrawingArea<DB, CT>, lines: &[Line], scale: &Scale) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    CT: CoordTranslate<From = (f64, f64)>,
{
    let mut failures: Vec<(f64, RGBColor)> = lines
        .iter()
        .flat_map(|l| l.unfinished().map(|x| (x, l.style.color)))
        .collect();
    failures.sort_by(|a, b| a.0.total_cmp(&b.0));
    let spacing = 2 * scale.marker + 2;
    for group in failures.chunk_by(|a, b| a.0 == b.0) {
        let first_offset = -(group.len() as i32 - 1) * spacing / 2;
        for (i, (x, color)) in group.iter().enumerate() {
            let dx = first_offset + i as i32 * spacing;
            draw_dnf_marker(plot, (*x, 0.0), dx, *color, scale.marker)?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Headings

pub(super) const TITLE_FONT: u32 = 24;
pub(super) const SUBTITLE_FONT: u32 = 16;
pub(super) const PAD: i32 = 10;

/// The non-empty heading lines with their font size and color.
fn heading<'a>(
    title: &'a str,
    subtitle: &'a str,
) -> impl Iterator<Item = (&'a str, u32, RGBColor)> {
    [
        (title, TITLE_FONT, TEXT),
        (subtitle, SUBTITLE_FONT, SUBTLE_TEXT),
    ]
    .into_iter()
    .filter(|(text, _, _)| !text.is_empty())
}

pub(super) fn heading_height(title: &str, subtitle: &str) -> i32 {
    PAD + heading(title, subtitle)
        .map(|(_, size, _)| size as i32 + 8)
        .sum::<i32>()
}

/// Draws the centered title and subtitle at the top of `root`.
pub(super) fn draw_heading<DB>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    subtitle: &str,
) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
{
    let width = root.dim_in_pixel().0 as i32;
    let mut y = PAD;
    for (text, size, color) in heading(title, subtitle) {
        let fitted = fit_font(text, size, width - 2 * PAD);
        let style = text_style(fitted, color, HPos::Center, VPos::Top);
        root.draw_text(text, &style, (width / 2, y))?;
        y += size as i32 + 8;
    }
    Ok(())
}
