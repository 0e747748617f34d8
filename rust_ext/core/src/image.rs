//! What an image costs, per provider. Each rule follows the provider's published arithmetic; the
//! worked examples in the tests are the ones the providers publish. An image is priced at the
//! size it was given, else the size its header gives when it is sent inline
//! (`crate::image_header`), else at the rule's price for an unknown size.

use crate::block::Image;

/// How the size an image is priced at is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeBasis {
    /// The part's `width` and `height` (both positive).
    Given,
    /// Read from the header of the image sent inline (a base64 `data:` URL or Anthropic source).
    Header,
    /// Neither: the rule's price for an image of unknown size.
    Unknown,
}

impl SizeBasis {
    pub fn as_str(self) -> &'static str {
        match self {
            SizeBasis::Given => "given",
            SizeBasis::Header => "header",
            SizeBasis::Unknown => "unknown",
        }
    }
}

impl Image {
    /// The size the image is priced at, `(width, height)` in pixels, and how it is known.
    pub fn priced_size(&self) -> (Option<(u64, u64)>, SizeBasis) {
        match (self.width, self.height, self.header_size) {
            (Some(w), Some(h), _) if w > 0 && h > 0 => (Some((w, h)), SizeBasis::Given),
            (_, _, Some(size)) => (Some(size), SizeBasis::Header),
            _ => (None, SizeBasis::Unknown),
        }
    }
}

/// How a profile prices an image part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageRule {
    /// The same cost for every image (the `heuristic` profile: 765).
    Flat(u64),
    /// OpenAI's tile rule (GPT-4o, GPT-4.1, GPT-4 Turbo vision), "Calculating costs" in OpenAI's
    /// vision guide: `low` detail costs 85; otherwise the image is scaled to fit 2048×2048, then
    /// so its shortest side is at most 768, and costs 85 + 170 per 512-pixel tile.
    OpenAiTiles,
    /// Anthropic's pixel-area rule ("Vision" guide, "Calculate image costs"): an image is first
    /// scaled down to a long edge of at most 1568 px and at most 1,200,000 pixels (≈1600 tokens),
    /// then costs `width × height / 750` tokens, rounded up.
    AnthropicArea,
}

const OPENAI_BASE: u64 = 85;
const OPENAI_PER_TILE: u64 = 170;
const OPENAI_TILE: f64 = 512.0;
/// An image of unknown size at high or auto detail is priced as a square of at least 768 px
/// (4 tiles), OpenAI's own 1024×1024 example, rather than guessing an aspect ratio.
const OPENAI_UNKNOWN_SIZE: u64 = OPENAI_BASE + 4 * OPENAI_PER_TILE;

const ANTHROPIC_MAX_EDGE: f64 = 1568.0;
const ANTHROPIC_MAX_PIXELS: f64 = 1_200_000.0;
const ANTHROPIC_PIXELS_PER_TOKEN: f64 = 750.0;
/// An image of unknown size is priced at the ceiling the resize enforces.
const ANTHROPIC_UNKNOWN_SIZE: u64 = 1600;

impl ImageRule {
    pub fn tokens(self, image: &Image) -> u64 {
        match self {
            ImageRule::Flat(tokens) => tokens,
            ImageRule::OpenAiTiles => openai_tiles(image),
            ImageRule::AnthropicArea => anthropic_area(image),
        }
    }

    /// A one-line description for profile listings.
    pub fn describe(self) -> String {
        match self {
            ImageRule::Flat(tokens) => format!("{tokens} per image"),
            ImageRule::OpenAiTiles => "OpenAI tiles: low 85; else 85 + 170 per 512px tile after fitting 2048px \
                                       and a 768px shortest side (unknown size: 765)"
                .to_owned(),
            ImageRule::AnthropicArea => "Anthropic area: width*height/750 after fitting a 1568px long edge and \
                                         1.2 MP (unknown size: 1600)"
                .to_owned(),
        }
    }
}

fn dimensions(image: &Image) -> Option<(f64, f64)> {
    image.priced_size().0.map(|(w, h)| (w as f64, h as f64))
}

fn openai_tiles(image: &Image) -> u64 {
    if image.detail.as_deref() == Some("low") {
        return OPENAI_BASE;
    }
    // `high`, `auto` and no detail: `auto` lets the model choose, so count the dearer option.
    let Some((mut w, mut h)) = dimensions(image) else { return OPENAI_UNKNOWN_SIZE };
    let fit = (2048.0 / w.max(h)).min(1.0);
    (w, h) = (w * fit, h * fit);
    let shortest = (768.0 / w.min(h)).min(1.0);
    (w, h) = ((w * shortest).floor(), (h * shortest).floor());
    let tiles = (w / OPENAI_TILE).ceil() as u64 * (h / OPENAI_TILE).ceil() as u64;
    OPENAI_BASE + OPENAI_PER_TILE * tiles
}

fn anthropic_area(image: &Image) -> u64 {
    let Some((w, h)) = dimensions(image) else { return ANTHROPIC_UNKNOWN_SIZE };
    let scale = (ANTHROPIC_MAX_EDGE / w.max(h)).min((ANTHROPIC_MAX_PIXELS / (w * h)).sqrt()).min(1.0);
    let (w, h) = ((w * scale).floor(), (h * scale).floor());
    (w * h / ANTHROPIC_PIXELS_PER_TOKEN).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(detail: Option<&str>, width: u64, height: u64) -> Image {
        Image { detail: detail.map(str::to_owned), width: Some(width), height: Some(height), header_size: None }
    }

    #[test]
    fn openai_worked_examples() {
        let rule = ImageRule::OpenAiTiles;
        // OpenAI's examples: 1024×1024 high → 768×768, 4 tiles, 765 tokens.
        assert_eq!(rule.tokens(&image(Some("high"), 1024, 1024)), 765);
        // 2048×4096 high → 1024×2048 → 768×1536, 6 tiles, 1105 tokens.
        assert_eq!(rule.tokens(&image(Some("high"), 2048, 4096)), 1105);
        // 4096×8192 low → 85 whatever the size.
        assert_eq!(rule.tokens(&image(Some("low"), 4096, 8192)), 85);
        // A small image is not scaled up: 512×512 is one tile.
        assert_eq!(rule.tokens(&image(None, 512, 512)), 255);
        // 1920×1080 → 1365×768 → 3×2 tiles.
        assert_eq!(rule.tokens(&image(Some("auto"), 1920, 1080)), 85 + 6 * 170);
        assert_eq!(rule.tokens(&Image::default()), 765);
    }

    #[test]
    fn anthropic_worked_examples() {
        let rule = ImageRule::AnthropicArea;
        // Anthropic's table: 200×200 ≈ 54, 1000×1000 ≈ 1334, 1092×1092 ≈ 1590 tokens.
        assert_eq!(rule.tokens(&image(None, 200, 200)), 54);
        assert_eq!(rule.tokens(&image(None, 1000, 1000)), 1334);
        assert_eq!(rule.tokens(&image(None, 1092, 1092)), 1590);
        // Larger images are scaled down first, so the cost stays at or under ~1600.
        let big = rule.tokens(&image(None, 4000, 3000));
        assert!((1500..=1600).contains(&big), "{big}");
        // A long edge over 1568 is capped even when the area is small: 3136×100 → 1568×50.
        assert_eq!(rule.tokens(&image(None, 3136, 100)), (1568.0_f64 * 50.0 / 750.0).ceil() as u64);
        assert_eq!(rule.tokens(&Image::default()), 1600);
    }

    #[test]
    fn a_given_size_then_the_header_size_then_unknown() {
        let header = |width, height| Image { width, height, header_size: Some((2048, 1024)), ..Image::default() };
        assert_eq!(image(None, 512, 512).priced_size(), (Some((512, 512)), SizeBasis::Given));
        assert_eq!(header(None, None).priced_size(), (Some((2048, 1024)), SizeBasis::Header));
        // Half a size, or a zero, is no size given.
        assert_eq!(header(Some(512), None).priced_size().1, SizeBasis::Header);
        assert_eq!(header(Some(0), Some(0)).priced_size().1, SizeBasis::Header);
        assert_eq!(Image::default().priced_size(), (None, SizeBasis::Unknown));
        // Priced by the header's size as if given: 2048x1024 -> 1536x768, 6 tiles.
        assert_eq!(ImageRule::OpenAiTiles.tokens(&header(None, None)), 1105);
        assert_eq!(
            ImageRule::AnthropicArea.tokens(&header(None, None)),
            ImageRule::AnthropicArea.tokens(&image(None, 2048, 1024))
        );
    }

    #[test]
    fn flat_is_flat() {
        assert_eq!(ImageRule::Flat(765).tokens(&image(Some("low"), 1, 1)), 765);
    }
}
