use super::chart::{axes, format_y, x_ticks, STANDARD_X_TICKS, TITLE_FONT, X_DESC, Y_DESC};
use super::font::{find_font, style_penalty, text_width};
use super::legend::{LegendItem, Swatch, DNF_LABEL};
use super::style::{known_style, FALLBACK_COLORS, KNOWN_MODES};
use super::*;

const MODES: [&str; 7] = [
    "native",
    "swap-zram",
    "swap-file",
    "farmem",
    "farmem-tcp",
    "farmem-hinted",
    "farmem-hinted-tcp",
];
const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];

/// 7 modes at 100, 75, 50, 25, 10 % local memory; Linux swap dies at the small sizes.
fn example() -> Vec<Series> {
    MODES
        .iter()
        .enumerate()
        .map(|(i, mode)| Series {
            mode: mode.to_string(),
            points: [100.0, 75.0, 50.0, 25.0, 10.0]
                .into_iter()
                .map(|pct: f64| {
                    let oom = mode.starts_with("swap") && pct < 30.0;
                    let y = pct / 100.0 + i as f64 * 0.05;
                    (pct, (!oom).then_some(y))
                })
                .collect(),
        })
        .collect()
}

fn series(mode: &str, points: &[(f64, Option<f64>)]) -> Series {
    Series {
        mode: mode.to_string(),
        points: points.to_vec(),
    }
}

/// A fresh directory per test, so tests can run in parallel.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("suiteplot-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// All text in the SVG, after checking that it is well-formed XML.
fn svg_texts(path: &Path) -> Vec<String> {
    let xml = fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&xml).expect("SVG is well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(|t| t.trim().to_string())
        .collect()
}

fn png_dimensions(path: &Path) -> (u32, u32) {
    let bytes = fs::read(path).unwrap();
    assert_eq!(bytes[..8], PNG_SIGNATURE);
    // The IHDR chunk comes first: length (4), type (4), then width and height, big-endian.
    assert_eq!(&bytes[12..16], b"IHDR");
    let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    (be(16), be(20))
}

#[test]
fn workload_plot_writes_svg_and_png() {
    let dir = scratch("workload");
    let (svg, png) = (dir.join("w.svg"), dir.join("w.png"));
    let written = workload_plot("memcached", "ops/s", &example(), &svg, Some(&png)).unwrap();

    let texts = svg_texts(&svg);
    for expected in MODES
        .iter()
        .chain(&[X_DESC, Y_DESC, DNF_LABEL, "memcached", "ops/s"])
    {
        assert!(
            texts.iter().any(|t| t == expected),
            "no {expected:?} in {texts:?}"
        );
    }
    if find_font().is_some() {
        assert_eq!(written, vec![svg, png.clone()]);
        assert_eq!(png_dimensions(&png), WORKLOAD_SIZE);
    } else {
        assert_eq!(written, vec![svg]);
    }
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn overview_plot_writes_a_grid() {
    let dir = scratch("overview");
    let (svg, png) = (dir.join("o.svg"), dir.join("o.png"));
    let panels: Vec<(String, Vec<Series>)> = ["a", "b", "c", "d"]
        .iter()
        .map(|name| (format!("workload-{name}"), example()))
        .collect();
    let written = overview_plot("all", &panels, &svg, Some(&png)).unwrap();

    let texts = svg_texts(&svg);
    for expected in MODES.iter().chain(&["workload-a", "workload-d", DNF_LABEL]) {
        assert!(texts.iter().any(|t| t == expected), "no {expected:?}");
    }
    // One shared legend, not one per panel.
    assert_eq!(texts.iter().filter(|t| *t == "farmem").count(), 1);
    if find_font().is_some() {
        assert_eq!(written.len(), 2);
        let (w, h) = png_dimensions(&png);
        assert_eq!(w, OVERVIEW_WIDTH);
        assert!((2 * OVERVIEW_ROW_HEIGHT..2 * OVERVIEW_ROW_HEIGHT + 200).contains(&h));
    }
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn edge_cases_render_without_panicking() {
    let dir = scratch("edges");
    let cases: Vec<Vec<Series>> = vec![
        vec![],
        vec![series("farmem", &[])],
        vec![series("farmem", &[(50.0, Some(0.5))])],
        vec![series("swap-file", &[(100.0, None), (50.0, None)])],
        vec![series(
            "farmem",
            &[
                (f64::NAN, Some(1.0)),
                (f64::INFINITY, Some(1.0)),
                (100.0, Some(f64::NAN)),
                (75.0, Some(f64::INFINITY)),
                (50.0, Some(f64::NEG_INFINITY)),
                (25.0, Some(-0.5)),
                (25.0, Some(0.2)),
            ],
        )],
        vec![series(
            "farmem",
            &[(100.0, Some(1e300)), (1e300, Some(f64::MAX))],
        )],
        vec![series(
            "some-new-mode",
            &[(-10.0, Some(0.3)), (150.0, Some(3.0))],
        )],
    ];
    for (i, case) in cases.iter().enumerate() {
        let (svg, png) = (dir.join(format!("{i}.svg")), dir.join(format!("{i}.png")));
        workload_plot("edge", "", case, &svg, Some(&png)).unwrap();
        svg_texts(&svg);
    }
    let panels: Vec<(String, Vec<Series>)> =
        cases.into_iter().map(|c| (String::new(), c)).collect();
    for (i, panels) in [&panels[..0], &panels[..1], &panels[..]].iter().enumerate() {
        let (svg, png) = (dir.join(format!("o{i}.svg")), dir.join(format!("o{i}.png")));
        overview_plot("", panels, &svg, Some(&png)).unwrap();
        svg_texts(&svg);
    }
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn unwritable_paths_are_errors() {
    let dir = scratch("unwritable");
    let file = dir.join("a-file");
    fs::write(&file, "not a directory").unwrap();
    let under_file = file.join("plot.svg");
    let err = workload_plot("t", "", &example(), &under_file, None).unwrap_err();
    assert!(format!("{err:#}").contains("a-file"), "{err:#}");

    if find_font().is_some() {
        let svg = dir.join("ok.svg");
        let err = workload_plot("t", "", &example(), &svg, Some(&dir.join("x.jpg")));
        assert!(format!("{:#}", err.unwrap_err()).contains(".png"));
        let err = overview_plot("t", &[], &svg, Some(&file.join("o.png")));
        assert!(err.is_err());
    }
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn missing_parent_directories_are_created() {
    let dir = scratch("parents");
    let svg = dir.join("deeper/still/plot.svg");
    workload_plot("t", "", &example(), &svg, None).unwrap();
    assert!(svg.is_file());
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn known_modes_have_distinct_fixed_styles() {
    for (i, (a, style_a)) in KNOWN_MODES.iter().enumerate() {
        assert_eq!(Palette::new([*a]).style(a), *style_a);
        for (b, style_b) in &KNOWN_MODES[i + 1..] {
            assert_ne!(style_a.color, style_b.color, "{a} and {b} share a color");
        }
    }
    let style = |m| known_style(m).unwrap();
    assert!(style("swap-file").dashed && !style("farmem").dashed);
    assert!(style("farmem-tcp").hollow && !style("farmem").hollow);
}

#[test]
fn unknown_modes_get_stable_distinct_fallback_colors() {
    let alone = Palette::new(["cxl-tiering"]).style("cxl-tiering");
    assert!(FALLBACK_COLORS.contains(&alone.color));
    assert!(KNOWN_MODES.iter().all(|(_, s)| s.color != alone.color));

    // Enough modes to force hash collisions: all differ, whatever order they come in.
    let modes = ["a", "b", "c", "d", "e", "f", "cxl-tiering", "farmem"];
    let palette = Palette::new(modes);
    let colors: Vec<RGBColor> = modes[..6].iter().map(|m| palette.style(m).color).collect();
    assert!(colors
        .iter()
        .all(|c| colors.iter().filter(|d| *d == c).count() == 1));
    let reversed = Palette::new(modes.iter().rev().copied());
    assert!(modes.iter().all(|m| reversed.style(m) == palette.style(m)));
}

#[test]
fn ticks_sit_at_the_data_and_quarters_without_crowding() {
    let range = 0.0..100.0;
    let data = [100.0, 75.0, 50.0, 25.0, 10.0, 10.0];
    assert_eq!(
        x_ticks(&data, &range, 0.04),
        [0.0, 10.0, 25.0, 50.0, 75.0, 100.0]
    );
    // 12 is too close to 10; 23 displaces the quarter mark at 25.
    assert_eq!(
        x_ticks(&[10.0, 12.0, 23.0], &range, 0.04),
        [0.0, 10.0, 23.0, 50.0, 75.0, 100.0]
    );
    assert_eq!(x_ticks(&[], &range, 0.04), STANDARD_X_TICKS);
}

#[test]
fn axes_cover_the_data_with_headroom() {
    let data = [series("farmem", &[(10.0, Some(2.0)), (120.0, None)])];
    let found = axes(&clean(&data, &Palette::new([])), 0.04);
    assert_eq!(found.x, 0.0..120.0);
    assert_eq!(found.y, 0.0..2.1);
    assert_eq!(axes(&[], 0.04).y, 0.0..1.1);
}

#[test]
fn lines_break_where_runs_did_not_finish() {
    let data = [series(
        "farmem",
        &[
            (10.0, Some(0.1)),
            (25.0, None),
            (50.0, Some(0.5)),
            (75.0, Some(f64::NAN)),
            (100.0, Some(1.0)),
        ],
    )];
    let lines = clean(&data, &Palette::new([]));
    assert_eq!(
        lines[0].runs(),
        vec![vec![(10.0, 0.1)], vec![(50.0, 0.5)], vec![(100.0, 1.0)]]
    );
    assert_eq!(lines[0].unfinished().collect::<Vec<_>>(), [25.0, 75.0]);
}

#[test]
fn legend_lists_each_mode_once_in_fixed_order() {
    let data = [
        series("farmem", &[(10.0, Some(0.1))]),
        series("mystery", &[(10.0, Some(0.1))]),
        series("native", &[(10.0, Some(1.0))]),
        series("farmem", &[(25.0, Some(0.2))]),
    ];
    let labels: Vec<String> = legend_items(&clean(&data, &Palette::new([])))
        .into_iter()
        .map(|i| i.label)
        .collect();
    assert_eq!(labels, ["native", "farmem", "mystery"]);
}

#[test]
fn legend_rows_fit_and_are_balanced() {
    let items = |n: usize| {
        (0..n)
            .map(|i| LegendItem {
                swatch: Swatch::DidNotFinish,
                label: format!("mode-{i}"),
            })
            .collect()
    };
    let legend = Legend::new(items(8), 400);
    assert!(legend.rows.len() > 1);
    assert!(legend.rows.iter().all(|(_, w)| *w <= 400));
    let counts: Vec<usize> = legend.rows.iter().map(|(r, _)| r.len()).collect();
    assert!(
        counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1,
        "{counts:?}"
    );
    assert_eq!(Legend::new(items(0), 400).height(), 0);
}

#[test]
fn long_titles_shrink_to_fit() {
    let long = "memcached, 64 GiB working set, zipf 0.99, 16 threads, 10 minutes";
    let fitted = fit_font(long, TITLE_FONT, 600);
    assert!(fitted < TITLE_FONT);
    assert!(text_width(long, fitted) <= 600);
    assert_eq!(fit_font("short", TITLE_FONT, 600), TITLE_FONT);
    assert_eq!(fit_font(&long.repeat(10), TITLE_FONT, 600), 9);
}

#[test]
fn y_labels_stay_short() {
    assert_eq!(format_y(0.5, 1.1), "0.5");
    assert_eq!(format_y(250.0, 300.0), "250");
    assert_eq!(format_y(2.5e300, 1e301), "2.5e300");
}

#[test]
fn plain_sans_fonts_are_preferred() {
    let penalty = |name: &str| style_penalty(Path::new(name));
    assert!(penalty("DejaVuSans.ttf") < penalty("DejaVuSans-Bold.ttf"));
    assert!(penalty("DejaVuSans.ttf") < penalty("DejaVuMathTeXGyre.ttf"));
    assert!(penalty("LiberationSans-Regular.ttf") < penalty("LiberationSerif-Regular.ttf"));
}
