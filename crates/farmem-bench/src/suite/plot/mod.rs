//! Plots for the benchmark suite: normalized throughput against the share of local memory,
//! one line per mode, as a figure per workload and as an overview grid.
//!
//! Text: plotters' `ab_glyph` backend has no built-in font, so the PNG needs a TrueType file
//! from the system ([`find_font`]), registered once per process as plotters' "sans-serif".
//! The SVG backend only writes `<text>` elements, so SVG works without a font as long as we
//! avoid plotters features that measure text (chart captions, the built-in series legend).
//! That is why titles and legends are drawn by hand here.

mod chart;
mod font;
mod legend;
mod style;
#[cfg(test)]
mod tests;

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

use chart::{
    draw_chart, draw_heading, heading_height, text_style, AxisDesc, PAD, PANEL_SCALE,
    SUBTITLE_FONT, WORKLOAD_SCALE,
};
use font::fit_font;
pub use font::font_ready;
use legend::{legend_items, Legend};
use style::{clean, Line, Palette, SUBTLE_TEXT, TEXT};

/// One line of a plot: a mode's normalized throughput (1.0 = native) at each local-memory percentage.
pub struct Series {
    pub mode: String,
    /// (local memory %, normalized throughput); None = the run did not finish (e.g. OOM-killed).
    pub points: Vec<(f64, Option<f64>)>,
}

const WORKLOAD_SIZE: (u32, u32) = (800, 500);
const OVERVIEW_WIDTH: u32 = 1500;
const OVERVIEW_ROW_HEIGHT: u32 = 480;
const OVERVIEW_COLUMNS: usize = 3;

// ---------------------------------------------------------------------------------------------
// Figures

/// A figure drawn the same way on the SVG and the PNG backend.
trait Figure {
    fn size(&self) -> (u32, u32);
    fn draw<DB>(&self, root: &DrawingArea<DB, Shift>) -> Result<()>
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static;
}

const PANEL_TITLE_FONT: u32 = 18;

struct WorkloadFigure<'a> {
    title: &'a str,
    subtitle: &'a str,
    lines: Vec<Line<'a>>,
}

impl Figure for WorkloadFigure<'_> {
    fn size(&self) -> (u32, u32) {
        WORKLOAD_SIZE
    }

    fn draw<DB>(&self, root: &DrawingArea<DB, Shift>) -> Result<()>
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static,
    {
        root.fill(&WHITE)?;
        draw_heading(root, self.title, self.subtitle)?;
        let top = heading_height(self.title, self.subtitle);
        let legend = Legend::new(legend_items(&self.lines), WORKLOAD_SIZE.0 as i32 - 2 * PAD);
        let (_, below) = root.split_vertically(top);
        let (legend_area, chart_area) = below.split_vertically(legend.height() + PAD / 2);
        legend.draw(&legend_area)?;
        draw_chart(
            &chart_area,
            &self.lines,
            &WORKLOAD_SCALE,
            AxisDesc { x: true, y: true },
        )
    }
}

struct OverviewFigure<'a> {
    title: &'a str,
    panels: Vec<(&'a str, Vec<Line<'a>>)>,
    legend: Legend,
}

impl<'a> OverviewFigure<'a> {
    fn new(title: &'a str, panels: &'a [(String, Vec<Series>)]) -> Self {
        let all_series = panels.iter().flat_map(|(_, s)| s);
        let palette = Palette::new(all_series.map(|s| s.mode.as_str()));
        let panels: Vec<_> = panels
            .iter()
            .map(|(name, s)| (name.as_str(), clean(s, &palette)))
            .collect();
        let items = legend_items(panels.iter().flat_map(|(_, lines)| lines));
        let legend = Legend::new(items, OVERVIEW_WIDTH as i32 - 2 * PAD);
        OverviewFigure {
            title,
            panels,
            legend,
        }
    }

    fn rows(&self) -> usize {
        self.panels.len().div_ceil(OVERVIEW_COLUMNS)
    }

    /// Title and legend share the band above the grid.
    fn header_height(&self) -> i32 {
        heading_height(self.title, "") + self.legend.height() + PAD
    }
}

impl Figure for OverviewFigure<'_> {
    fn size(&self) -> (u32, u32) {
        let rows = self.rows().max(1) as u32;
        (
            OVERVIEW_WIDTH,
            self.header_height() as u32 + rows * OVERVIEW_ROW_HEIGHT,
        )
    }

    fn draw<DB>(&self, root: &DrawingArea<DB, Shift>) -> Result<()>
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static,
    {
        root.fill(&WHITE)?;
        draw_heading(root, self.title, "")?;
        let (_, below) = root.split_vertically(heading_height(self.title, ""));
        self.legend.draw(&below)?;
        let (_, grid) = root.split_vertically(self.header_height());
        if self.panels.is_empty() {
            let note = text_style(SUBTITLE_FONT, SUBTLE_TEXT, HPos::Center, VPos::Center);
            let (w, h) = grid.dim_in_pixel();
            grid.draw_text("no data", &note, (w as i32 / 2, h as i32 / 2))?;
            return Ok(());
        }
        let cells = grid.split_evenly((self.rows(), OVERVIEW_COLUMNS));
        for (i, ((name, lines), cell)) in self.panels.iter().zip(&cells).enumerate() {
            // Only the outer edges of the grid carry axis descriptions.
            let desc = AxisDesc {
                x: i + OVERVIEW_COLUMNS >= self.panels.len(),
                y: i % OVERVIEW_COLUMNS == 0,
            };
            draw_panel(cell, name, lines, desc)?;
        }
        Ok(())
    }
}

fn draw_panel<DB>(
    cell: &DrawingArea<DB, Shift>,
    name: &str,
    lines: &[Line],
    desc: AxisDesc,
) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
{
    let (title_area, chart_area) = cell.split_vertically(PANEL_TITLE_FONT as i32 + 8);
    // Centered over the plot rather than the cell, which includes the y label area.
    let (w, _) = cell.dim_in_pixel();
    let plot_center =
        (PANEL_SCALE.y_label_area as i32 + w as i32 - PANEL_SCALE.right_margin as i32) / 2;
    let size = fit_font(name, PANEL_TITLE_FONT, 2 * (w as i32 - plot_center) - PAD);
    let style = text_style(size, TEXT, HPos::Center, VPos::Top);
    title_area.draw_text(name, &style, (plot_center, 4))?;
    draw_chart(&chart_area, lines, &PANEL_SCALE, desc)
}

// ---------------------------------------------------------------------------------------------
// Output

/// Writes the SVG always and the PNG when a font is available; returns the paths written.
fn write_figure(figure: &impl Figure, svg: &Path, png: Option<&Path>) -> Result<Vec<PathBuf>> {
    // Before any drawing, so that legend layout measures text the same way in both formats.
    let have_font = font_ready();
    write_svg(figure, svg)?;
    let mut written = vec![svg.to_path_buf()];
    if let Some(png) = png.filter(|_| have_font) {
        write_png(figure, png)?;
        written.push(png.to_path_buf());
    }
    Ok(written)
}

fn write_svg(figure: &impl Figure, path: &Path) -> Result<()> {
    create_parent(path)?;
    let root = SVGBackend::new(path, figure.size()).into_drawing_area();
    figure
        .draw(&root)
        .with_context(|| format!("drawing {}", path.display()))?;
    root.present()
        .with_context(|| format!("writing SVG {}", path.display()))
}

fn write_png(figure: &impl Figure, path: &Path) -> Result<()> {
    // plotters hands the file to the `image` crate, which picks the encoder by extension.
    if !path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"))
    {
        bail!("PNG output path {} must end in .png", path.display());
    }
    create_parent(path)?;
    let root = BitMapBackend::new(path, figure.size()).into_drawing_area();
    figure
        .draw(&root)
        .with_context(|| format!("drawing {}", path.display()))?;
    root.present()
        .with_context(|| format!("writing PNG {}", path.display()))
}

fn create_parent(path: &Path) -> Result<()> {
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) => {
            fs::create_dir_all(dir).with_context(|| format!("creating directory {}", dir.display()))
        }
        None => Ok(()),
    }
}

/// Per workload: normalized throughput against local memory %, one line per mode, dashed
/// horizontal line at 1.0 labelled "native". Writes the SVG always, the PNG when a font was found
/// (registering it once with plotters' ab_glyph). Returns the paths written.
pub fn workload_plot(
    title: &str,
    subtitle: &str,
    series: &[Series],
    svg: &Path,
    png: Option<&Path>,
) -> anyhow::Result<Vec<PathBuf>> {
    let palette = Palette::new(series.iter().map(|s| s.mode.as_str()));
    let figure = WorkloadFigure {
        title,
        subtitle,
        lines: clean(series, &palette),
    };
    write_figure(&figure, svg, png)
}

/// All workloads as small multiples in one figure (a grid, 3 columns), one shared legend: the
/// picture for the README.
pub fn overview_plot(
    title: &str,
    panels: &[(String, Vec<Series>)],
    svg: &Path,
    png: Option<&Path>,
) -> anyhow::Result<Vec<PathBuf>> {
    write_figure(&OverviewFigure::new(title, panels), svg, png)
}
