//! How things look: the colors of text and chart furniture, the per-mode styles (color, dashes,
//! marker) with the palette for unknown modes, and the input cleaned into lines ready to draw.

use plotters::prelude::*;

use super::Series;

pub(super) const TEXT: RGBColor = RGBColor(30, 30, 30);
pub(super) const SUBTLE_TEXT: RGBColor = RGBColor(90, 90, 90);
pub(super) const GRID: RGBColor = RGBColor(225, 225, 225);
pub(super) const AXIS: RGBColor = RGBColor(90, 90, 90);
pub(super) const REFERENCE: RGBColor = RGBColor(110, 110, 110);

// ---------------------------------------------------------------------------------------------
// Mode styles

#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) enum Marker {
    Circle,
    Square,
    Triangle,
    Diamond,
}

/// Visual identity of a mode. The color family says which mechanism (grey/brown = Linux swap,
/// blue = farmem, green/orange = hinted farmem); dashes mark Linux swap; hollow markers mark TCP.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) struct ModeStyle {
    pub(super) color: RGBColor,
    pub(super) dashed: bool,
    pub(super) hollow: bool,
    pub(super) marker: Marker,
}

const fn style(color: RGBColor, dashed: bool, hollow: bool, marker: Marker) -> ModeStyle {
    ModeStyle {
        color,
        dashed,
        hollow,
        marker,
    }
}

/// Known modes, in legend order.
pub(super) const KNOWN_MODES: &[(&str, ModeStyle)] = &[
    (
        "native",
        style(RGBColor(40, 40, 40), false, false, Marker::Diamond),
    ),
    (
        "swap-zram",
        style(RGBColor(140, 86, 60), true, false, Marker::Square),
    ),
    (
        "swap-file",
        style(RGBColor(140, 140, 140), true, false, Marker::Square),
    ),
    (
        "farmem",
        style(RGBColor(0, 90, 180), false, false, Marker::Circle),
    ),
    (
        "farmem-tcp",
        style(RGBColor(60, 160, 230), false, true, Marker::Circle),
    ),
    (
        "farmem-hinted",
        style(RGBColor(0, 150, 90), false, false, Marker::Triangle),
    ),
    (
        "farmem-hinted-tcp",
        style(RGBColor(230, 130, 0), false, true, Marker::Triangle),
    ),
];

/// For unknown modes: hues not used by the known ones, so the two never get confused.
pub(super) const FALLBACK_COLORS: [RGBColor; 6] = [
    RGBColor(150, 90, 180),
    RGBColor(210, 50, 50),
    RGBColor(200, 100, 170),
    RGBColor(150, 150, 20),
    RGBColor(0, 150, 160),
    RGBColor(100, 60, 140),
];

pub(super) fn known_style(mode: &str) -> Option<ModeStyle> {
    KNOWN_MODES
        .iter()
        .find(|(name, _)| *name == mode)
        .map(|(_, s)| *s)
}

/// Styles for the modes of one figure. An unknown mode gets the fallback color picked by a hash
/// of its name, so it keeps its color across figures, unless another unknown mode of the same
/// figure already has it: then the next free one, so no two lines look alike.
pub(super) struct Palette {
    unknown: Vec<(String, RGBColor)>,
}

impl Palette {
    pub(super) fn new<'a>(modes: impl IntoIterator<Item = &'a str>) -> Self {
        let mut names: Vec<&str> = modes
            .into_iter()
            .filter(|m| known_style(m).is_none())
            .collect();
        // Sorted, so the assignment depends on the set of modes, not on their order.
        names.sort_unstable();
        names.dedup();
        let mut taken = [false; FALLBACK_COLORS.len()];
        let unknown = names
            .into_iter()
            .map(|name| {
                if taken.iter().all(|t| *t) {
                    taken = [false; FALLBACK_COLORS.len()]; // more modes than colors: reuse
                }
                let mut slot = hashed_slot(name);
                while taken[slot] {
                    slot = (slot + 1) % FALLBACK_COLORS.len();
                }
                taken[slot] = true;
                (name.to_string(), FALLBACK_COLORS[slot])
            })
            .collect();
        Palette { unknown }
    }

    pub(super) fn style(&self, mode: &str) -> ModeStyle {
        known_style(mode).unwrap_or_else(|| {
            let color = self
                .unknown
                .iter()
                .find(|(name, _)| name == mode)
                .map_or(FALLBACK_COLORS[hashed_slot(mode)], |(_, c)| *c);
            style(color, false, false, Marker::Circle)
        })
    }
}

fn hashed_slot(mode: &str) -> usize {
    (fnv1a(mode) % FALLBACK_COLORS.len() as u64) as usize
}

/// FNV-1a: tiny and, unlike std's hasher, guaranteed stable across Rust versions.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

pub(super) fn legend_rank(mode: &str) -> usize {
    KNOWN_MODES
        .iter()
        .position(|(name, _)| *name == mode)
        .unwrap_or(KNOWN_MODES.len())
}

// ---------------------------------------------------------------------------------------------
// Input cleaning

/// A series ready to draw: finite x, sorted by x, non-finite throughput turned into None.
pub(super) struct Line<'a> {
    pub(super) mode: &'a str,
    pub(super) style: ModeStyle,
    pub(super) points: Vec<(f64, Option<f64>)>,
}

pub(super) fn clean<'a>(series: &'a [Series], palette: &Palette) -> Vec<Line<'a>> {
    series.iter().map(|s| clean_one(s, palette)).collect()
}

fn clean_one<'a>(series: &'a Series, palette: &Palette) -> Line<'a> {
    let mut points: Vec<_> = series
        .points
        .iter()
        .filter(|(x, _)| x.is_finite())
        .map(|&(x, y)| (x, y.filter(|v| v.is_finite())))
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    Line {
        mode: &series.mode,
        style: palette.style(&series.mode),
        points,
    }
}

impl Line<'_> {
    /// Stretches of finished runs; a line is broken wherever a run did not finish.
    pub(super) fn runs(&self) -> Vec<Vec<(f64, f64)>> {
        self.points
            .split(|(_, y)| y.is_none())
            .filter(|run| !run.is_empty())
            .map(|run| run.iter().filter_map(|&(x, y)| Some((x, y?))).collect())
            .collect()
    }

    pub(super) fn unfinished(&self) -> impl Iterator<Item = f64> + '_ {
        self.points
            .iter()
            .filter(|(_, y)| y.is_none())
            .map(|(x, _)| *x)
    }
}
