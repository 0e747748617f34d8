//! The size of an image sent inline, read from its own header: a base64 `data:` URL, or an
//! Anthropic base64 `source`, of a PNG, JPEG, GIF or WebP image (docs/semantics.md §2.2).
//!
//! The header is read by `imagesize` (its readers of those four formats only, which read the
//! bytes that hold the size and never decode the image). The base64 text is decoded from its
//! start only as far as the header needs: a first [`FIRST_READ`] bytes cover PNG (24), GIF (10)
//! and WebP (30); a JPEG's size is in its frame header (SOFn), after its metadata segments, so the
//! decoded prefix grows as the marker scan needs it, up to [`MAX_DECODED`]. An image whose size
//! lies further in, whose bytes are no supported format, or whose text is not base64, is of
//! unknown size.

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use imagesize::ImageError;
use std::io::ErrorKind;

/// The most bytes decoded for one image (a JPEG whose frame header comes after more metadata is
/// of unknown size).
pub const MAX_DECODED: usize = 64 * 1024;
/// The bytes decoded first: enough for a PNG, GIF or WebP header.
const FIRST_READ: usize = 64;
/// How much the decoded prefix grows each time the header reader runs out of bytes.
const GROWTH: usize = 8;
/// A `data:` URL's media type and parameters end within this many bytes, or the URL is not read.
const MAX_URL_HEAD: usize = 256;

/// Standard base64, padded or not, lenient about the unused bits of a last group (only a prefix
/// is decoded; a size is no place to be strict about the encoder).
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// The width and height in the header of the image a `data:` URL carries in base64
/// (`data:[<media type>][;<parameter>...];base64,<data>`, the scheme and `base64` in any case).
/// None for any other URL, and for an image of unknown size (see the module). The declared media
/// type is not trusted: the bytes say what the image is.
pub fn data_url_size(url: &str) -> Option<(u64, u64)> {
    let head = url.as_bytes().get(..5)?;
    if !head.eq_ignore_ascii_case(b"data:") {
        return None;
    }
    let rest = &url.as_bytes()[5..];
    let comma = rest.iter().take(MAX_URL_HEAD).position(|&b| b == b',')?;
    let params = &rest[..comma];
    let marker = b";base64";
    if params.len() < marker.len() || !params[params.len() - marker.len()..].eq_ignore_ascii_case(marker) {
        return None;
    }
    base64_size(&rest[comma + 1..])
}

/// The width and height in the header of the image whose base64 text is `text` (standard or
/// URL-safe alphabet, whitespace ignored); None when unknown (see the module).
pub fn base64_size(text: &[u8]) -> Option<(u64, u64)> {
    let mut prefix = Prefix { rest: text, bytes: Vec::new() };
    let mut want = FIRST_READ;
    loop {
        prefix.decode_to(want)?;
        // Groups of three bytes are decoded: the reader sees `want` bytes at most.
        let more = prefix.bytes.len() > want || !prefix.rest.is_empty();
        match imagesize::blob_size(&prefix.bytes[..prefix.bytes.len().min(want)]) {
            Ok(size) if size.width > 0 && size.height > 0 => return Some((size.width as u64, size.height as u64)),
            // The reader needs bytes past the prefix: decode more, while there are more.
            Err(ImageError::IoError(e)) if e.kind() == ErrorKind::UnexpectedEof && more && want < MAX_DECODED => {
                want = (want * GROWTH).min(MAX_DECODED);
            }
            _ => return None,
        }
    }
}

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r' | b'\x0c')
}

/// The decoded start of a base64 text, and the text not decoded yet.
struct Prefix<'a> {
    rest: &'a [u8],
    bytes: Vec<u8>,
}

impl Prefix<'_> {
    /// Decodes on until `len` bytes are decoded or the text ends; None when it is not base64.
    fn decode_to(&mut self, len: usize) -> Option<()> {
        if self.bytes.len() >= len || self.rest.is_empty() {
            return Some(());
        }
        // Whole groups of four characters, whitespace skipped; the last group may be short or
        // padded when the text ends.
        let wanted = (len - self.bytes.len()).div_ceil(3) * 4;
        let mut chars = Vec::with_capacity(wanted);
        let mut taken = 0;
        for &c in self.rest {
            if chars.len() == wanted {
                break;
            }
            taken += 1;
            match c {
                c if is_space(c) => {}
                b'-' => chars.push(b'+'), // the URL-safe alphabet
                b'_' => chars.push(b'/'),
                _ => chars.push(c),
            }
        }
        self.rest = &self.rest[taken..];
        if chars.last() == Some(&b'=') && !self.rest.iter().all(|&c| is_space(c)) {
            return None; // padding before the end: not one base64 text
        }
        BASE64.decode_vec(&chars, &mut self.bytes).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::STANDARD;

    // A PNG signature and IHDR chunk: 123 x 321.
    const PNG_HEAD: [u8; 33] = [
        0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x48, 0x44, 0x52, 0x00, 0x00,
        0x00, 0x7B, 0x00, 0x00, 0x01, 0x41, 0x08, 0x06, 0x00, 0x00, 0x00, 0x9A, 0x38, 0xC4, 0x00,
    ];

    fn data_url(media: &str, bytes: &[u8]) -> String {
        format!("data:{media};base64,{}", STANDARD.encode(bytes))
    }

    /// A JPEG whose frame header (640 x 480) follows a comment segment of `comment` bytes.
    fn jpeg_after(comment: usize) -> Vec<u8> {
        let mut bytes = vec![0xFF, 0xD8];
        let mut left = comment;
        while left > 0 {
            let n = left.min(65_533);
            bytes.extend([0xFF, 0xFE]);
            bytes.extend(((n + 2) as u16).to_be_bytes());
            bytes.extend(vec![b'c'; n]);
            left -= n;
        }
        bytes.extend([0xFF, 0xC0, 0x00, 0x11, 0x08, 0x01, 0xE0, 0x02, 0x80, 0x03]);
        bytes.extend([0u8; 9]);
        bytes.extend([0xFF, 0xD9]);
        bytes
    }

    #[test]
    fn reads_a_png_data_url() {
        assert_eq!(data_url_size(&data_url("image/png", &PNG_HEAD)), Some((123, 321)));
        // Any case, parameters before `;base64`, a wrong media type (the bytes decide).
        let url = data_url("image/jpeg", &PNG_HEAD).replacen("data:", "DATA:", 1).replacen(";base64", ";BASE64", 1);
        assert_eq!(data_url_size(&url), Some((123, 321)));
        let url = data_url("image/png;name=x.png", &PNG_HEAD);
        assert_eq!(data_url_size(&url), Some((123, 321)));
        // Whitespace (MIME line breaks) and the URL-safe alphabet.
        let text = STANDARD.encode(PNG_HEAD);
        let wrapped: String =
            text.as_bytes().chunks(8).map(|c| format!("{}\r\n", std::str::from_utf8(c).unwrap())).collect();
        assert_eq!(data_url_size(&format!("data:image/png;base64,{wrapped}")), Some((123, 321)));
        let url_safe = text.replace('+', "-").replace('/', "_");
        assert_eq!(base64_size(url_safe.as_bytes()), Some((123, 321)));
        // A whole small image, padded, then a line break.
        let padded = format!("{}\n", STANDARD.encode(&PNG_HEAD[..31]));
        assert!(padded.ends_with("=\n"));
        assert_eq!(base64_size(padded.as_bytes()), Some((123, 321)));
    }

    #[test]
    fn other_urls_and_bad_text_are_of_unknown_size() {
        assert_eq!(data_url_size("https://example.com/x.png"), None);
        assert_eq!(data_url_size("data:image/png,%89PNG"), None); // not base64
        assert_eq!(data_url_size("data:"), None);
        assert_eq!(data_url_size(""), None);
        assert_eq!(data_url_size("data:image/png;base64,!!!!"), None);
        assert_eq!(data_url_size(&data_url("image/png", &PNG_HEAD[..20])), None); // cut short
        assert_eq!(data_url_size(&data_url("image/bmp", b"BM\0\0\0\0\0\0\0\0\0\0\0\0\0\0")), None);
        // A media type too long to be one.
        let long = format!("data:image/png;{};base64,{}", "x".repeat(300), STANDARD.encode(PNG_HEAD));
        assert_eq!(data_url_size(&long), None);
        // Padding in the middle.
        let text = format!("{}={}", &STANDARD.encode(PNG_HEAD)[..3], &STANDARD.encode(PNG_HEAD)[3..]);
        assert_eq!(base64_size(text.as_bytes()), None);
    }

    #[test]
    fn a_jpeg_is_read_up_to_its_frame_header_within_the_bound() {
        assert_eq!(base64_size(STANDARD.encode(jpeg_after(0)).as_bytes()), Some((640, 480)));
        assert_eq!(base64_size(STANDARD.encode(jpeg_after(40_000)).as_bytes()), Some((640, 480)));
        // The frame header just inside and just past the bound (2 + 4 + n + 9 bytes read).
        let inside = MAX_DECODED - 2 - 4 - 9;
        assert_eq!(base64_size(STANDARD.encode(jpeg_after(inside)).as_bytes()), Some((640, 480)));
        assert_eq!(base64_size(STANDARD.encode(jpeg_after(inside + 1)).as_bytes()), None);
    }

    #[test]
    fn reads_the_test_images_of_every_format() {
        // tests/data/images: real encoders' files named by their size (make_images.py).
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/images");
        let mut read = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_owned();
            let size = name.rsplit_once('_').and_then(|(_, s)| s.split_once('.')).and_then(|(s, _)| s.split_once('x'));
            let Some((w, h)) = size else { continue };
            let got = data_url_size(&data_url("image/png", &std::fs::read(&path).unwrap()));
            // Its frame header is past the bound.
            let expected =
                if name.starts_with("jpeg_icc") { None } else { Some((w.parse().unwrap(), h.parse().unwrap())) };
            assert_eq!(got, expected, "{name}");
            read += 1;
        }
        assert_eq!(read, 12);
    }

    #[test]
    fn cut_or_changed_headers_give_a_size_or_none() {
        // Every cut of each test image's first KiB, and every byte of it set to a few values: no
        // panic, whatever the reader makes of it (the fuzz target block_parser goes further).
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/images");
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "py") {
                continue;
            }
            let mut bytes = std::fs::read(&path).unwrap();
            bytes.truncate(1024);
            for n in 0..bytes.len() {
                base64_size(STANDARD.encode(&bytes[..n]).as_bytes());
            }
            for i in 0..bytes.len() {
                let kept = bytes[i];
                for value in [0x00, 0x01, 0x7F, 0xFF, kept ^ 0x80] {
                    bytes[i] = value;
                    base64_size(STANDARD.encode(&bytes).as_bytes());
                }
                bytes[i] = kept;
            }
        }
    }

    #[test]
    fn decodes_no_more_than_the_header_needs() {
        // A PNG's header, then a megabyte of base64 text: never decoded.
        let text = format!("{}{}", STANDARD.encode(&PNG_HEAD[..30]), "A".repeat(1 << 20));
        assert_eq!(base64_size(text.as_bytes()), Some((123, 321)));
        let mut prefix = Prefix { rest: text.as_bytes(), bytes: Vec::new() };
        prefix.decode_to(FIRST_READ).unwrap();
        assert_eq!(prefix.bytes.len(), 66); // 22 groups of three bytes
        assert_eq!(prefix.rest.len(), text.len() - 88);
    }
}
