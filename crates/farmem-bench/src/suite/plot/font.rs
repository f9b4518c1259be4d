//! The font: finding a TrueType file on the system, registering it with plotters, and measuring
//! text with it (or estimating, without one).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::prelude::*;

pub(super) const FONT_FAMILY: &str = "sans-serif";

/// Well-known locations first, so every machine of one distribution picks the same face.
const PREFERRED_FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", // Debian, Ubuntu
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf", // Fedora
    "/usr/share/fonts/TTF/DejaVuSans.ttf",             // Arch
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",          // Alpine, older RHEL
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/liberation2/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
];
const FONT_ROOT: &str = "/usr/share/fonts";
/// Font directories are shallow; the limit only guards against symlink loops.
const FONT_SEARCH_DEPTH: usize = 5;

/// A TrueType font for the PNG text (PNG needs one; SVG does not): DejaVu Sans (or Liberation Sans
/// / any .ttf under /usr/share/fonts) found on the system, None if there is none.
pub fn find_font() -> Option<Vec<u8>> {
    PREFERRED_FONTS
        .iter()
        .map(PathBuf::from)
        .chain(plainest_ttf(Path::new(FONT_ROOT)))
        .find_map(|path| fs::read(path).ok())
}

/// The .ttf under `root` that looks most like a regular text face (a fallback after the
/// well-known names); ties go to the smallest path so the choice is stable.
fn plainest_ttf(root: &Path) -> Option<PathBuf> {
    let mut found = Vec::new();
    collect_ttf(root, FONT_SEARCH_DEPTH, &mut found);
    found
        .into_iter()
        .min_by_key(|p| (style_penalty(p), p.clone()))
}

fn collect_ttf(dir: &Path, depth: usize, found: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        if path.is_dir() && depth > 0 {
            collect_ttf(&path, depth - 1, found);
        } else if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("ttf"))
        {
            found.push(path);
        }
    }
}

/// Bold, italic, monospace, symbol... faces make poor axis labels.
pub(super) fn style_penalty(path: &Path) -> usize {
    const UNWANTED: &[&str] = &[
        "bold",
        "italic",
        "oblique",
        "mono",
        "math",
        "light",
        "condensed",
        "symbol",
        "serif",
    ];
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    let not_sans = usize::from(!name.contains("sans"));
    UNWANTED.iter().filter(|w| name.contains(*w)).count() * 2 + not_sans
}

/// Registers the system font with plotters on first use; whether there is one (PNGs need it).
/// plotters keeps fonts in a global table and wants `'static` bytes, so the font is leaked
/// once per process (a few hundred KiB).
pub fn font_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        find_font().is_some_and(|bytes| {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font(FONT_FAMILY, FontStyle::Normal, bytes).is_ok()
        })
    })
}

/// Width of `text` in pixels: measured when a font is registered, estimated otherwise (the SVG
/// without a font), generously so that estimated layouts never overlap.
pub(super) fn text_width(text: &str, size: u32) -> i32 {
    let measured = (FONT_FAMILY, size).into_font().box_size(text);
    match measured {
        Ok((w, _)) => w as i32,
        Err(_) => (text.chars().count() as f64 * f64::from(size) * 0.62).ceil() as i32,
    }
}

/// The largest font size up to `size` at which `text` fits in `width`, so that long titles
/// shrink instead of running off the picture.
pub(super) fn fit_font(text: &str, size: u32, width: i32) -> u32 {
    const SMALLEST: u32 = 9;
    (SMALLEST..=size)
        .rev()
        .find(|&s| text_width(text, s) <= width)
        .unwrap_or(SMALLEST)
}
