//! The legend: one entry per mode (plus the "did not finish" key), flowed into centered rows.

use std::ops::Range;

use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

use super::chart::{draw_dnf_marker, draw_marker, draw_path, text_style};
use super::font::text_width;
use super::style::{legend_rank, Line, ModeStyle, TEXT};

pub(super) const DNF_LABEL: &str = "did not finish (OOM-killed)";

pub(super) enum Swatch {
    Mode(ModeStyle),
    DidNotFinish,
}

pub(super) struct LegendItem {
    pub(super) swatch: Swatch,
    pub(super) label: String,
}

/// One entry per distinct mode in legend order, plus the "did not finish" key when needed.
pub(super) fn legend_items<'a>(lines: impl IntoIterator<Item = &'a Line<'a>>) -> Vec<LegendItem> {
    let mut modes: Vec<(&str, ModeStyle)> = Vec::new();
    let mut any_unfinished = false;
    for line in lines {
        if modes.iter().all(|(m, _)| *m != line.mode) {
            modes.push((line.mode, line.style));
        }
        any_unfinished |= line.unfinished().next().is_some();
    }
    modes.sort_by_key(|(m, _)| legend_rank(m)); // stable: unknown modes keep their input order
    let mut items: Vec<LegendItem> = modes
        .into_iter()
        .map(|(m, style)| LegendItem {
            swatch: Swatch::Mode(style),
            label: m.to_string(),
        })
        .collect();
    if any_unfinished {
        items.push(LegendItem {
            swatch: Swatch::DidNotFinish,
            label: DNF_LABEL.to_string(),
        });
    }
    items
}

const SWATCH_WIDTH: i32 = 34;
const SWATCH_GAP: i32 = 7;
const ITEM_GAP: i32 = 26;
const LEGEND_FONT: u32 = 15;
const LEGEND_ROW_HEIGHT: i32 = 24;
const LEGEND_MARKER: i32 = 5;

/// Legend entries flowed into centered rows that fit `width`; laid out before drawing because
/// the figure height depends on the number of rows.
pub(super) struct Legend {
    items: Vec<LegendItem>,
    /// Per row: the items' indices and the row's width.
    pub(super) rows: Vec<(Range<usize>, i32)>,
}

impl Legend {
    pub(super) fn new(items: Vec<LegendItem>, width: i32) -> Self {
        let widths: Vec<i32> = items
            .iter()
            .map(|i| SWATCH_WIDTH + SWATCH_GAP + text_width(&i.label, LEGEND_FONT))
            .collect();
        // As few rows as fit, then as even as possible: a full row over a lone straggler looks
        // lopsided, so narrow the limit for as long as the row count holds.
        let row_count = flow(&widths, width).len();
        let mut limit = width;
        while limit > 0 && flow(&widths, limit - 4).len() == row_count {
            limit -= 4;
        }
        Legend {
            rows: flow(&widths, limit),
            items,
        }
    }

    pub(super) fn height(&self) -> i32 {
        self.rows.len() as i32 * LEGEND_ROW_HEIGHT
    }

    /// Draws the rows centered in `area`, starting at its top.
    pub(super) fn draw<DB>(&self, area: &DrawingArea<DB, Shift>) -> Result<()>
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static,
    {
        let center = area.dim_in_pixel().0 as i32 / 2;
        for (row, (range, width)) in self.rows.iter().enumerate() {
            let y = row as i32 * LEGEND_ROW_HEIGHT + LEGEND_ROW_HEIGHT / 2;
            let mut x = center - width / 2;
            for item in &self.items[range.clone()] {
                draw_swatch(area, &item.swatch, x, y)?;
                let label_x = x + SWATCH_WIDTH + SWATCH_GAP;
                let style = text_style(LEGEND_FONT, TEXT, HPos::Left, VPos::Center);
                area.draw_text(&item.label, &style, (label_x, y))?;
                x = label_x + text_width(&item.label, LEGEND_FONT) + ITEM_GAP;
            }
        }
        Ok(())
    }
}

/// Greedy line breaking: each row takes items while they fit in `limit` (and at least one).
fn flow(widths: &[i32], limit: i32) -> Vec<(Range<usize>, i32)> {
    let mut rows = Vec::new();
    let (mut start, mut row_width) = (0, 0);
    for (i, &w) in widths.iter().enumerate() {
        let needed = if i == start {
            w
        } else {
            row_width + ITEM_GAP + w
        };
        if needed > limit && i > start {
            rows.push((start..i, row_width));
            (start, row_width) = (i, w);
        } else {
            row_width = needed;
        }
    }
    if start < widths.len() {
        rows.push((start..widths.len(), row_width));
    }
    rows
}

fn draw_swatch<DB>(area: &DrawingArea<DB, Shift>, swatch: &Swatch, x: i32, y: i32) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
{
    let middle = (x + SWATCH_WIDTH / 2, y);
    match swatch {
        Swatch::Mode(style) => {
            let line = vec![(x, y), (x + SWATCH_WIDTH, y)];
            draw_path(area, line, style.dashed, style.color.stroke_width(2))?;
            draw_marker(area, middle, *style, LEGEND_MARKER)
        }
        Swatch::DidNotFinish => draw_dnf_marker(area, middle, 0, TEXT, LEGEND_MARKER),
    }
}
