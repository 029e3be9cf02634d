//! The bytes one token stands for, as OpenAI's `logprobs` report them (`bytes`): a
//! byte-level BPE piece (`Ġthe`) mapped back through GPT-2's byte-to-character table, a
//! byte-fallback piece (`<0x0A>`) as its byte, a SentencePiece piece with `▁` as a space.
//! Invariant: for a byte-level or byte-fallback vocabulary, the concatenated bytes of a
//! sequence's non-special tokens are the UTF-8 of its decoded text (a token may hold part of
//! a character, which its own `token` string can only show as U+FFFD).

use crate::tokenizer::Tokenizer;

/// Byte `b`'s character in GPT-2's table (printable bytes are themselves; the other 68 are
/// U+0100 upwards, in byte order).
#[cfg(test)]
fn byte_char(b: u8) -> char {
    table().0[b as usize]
}

/// The byte a GPT-2 table character stands for, if it is one.
fn char_byte(c: char) -> Option<u8> {
    table().1.get(c as usize).copied().flatten()
}

/// GPT-2's byte-to-character table and its inverse (characters are below U+0144).
fn table() -> &'static ([char; 256], [Option<u8>; 324]) {
    static TABLE: std::sync::OnceLock<([char; 256], [Option<u8>; 324])> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let printable = |b: u8| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
        let (mut chars, mut bytes) = (['\0'; 256], [None; 324]);
        let mut next = 256u32;
        for b in 0..=255u8 {
            let c = if printable(b) {
                b as u32
            } else {
                next += 1;
                next - 1
            };
            chars[b as usize] = char::from_u32(c).expect("below U+0144");
            bytes[c as usize] = Some(b);
        }
        (chars, bytes)
    })
}

/// A byte-level piece's bytes, or `None` if a character is outside the table.
pub(crate) fn byte_level_bytes(piece: &str) -> Option<Vec<u8>> {
    piece.chars().map(char_byte).collect()
}

/// The byte of a byte-fallback piece `<0xXX>`.
pub(crate) fn fallback_byte(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok()).flatten()
}

impl Tokenizer {
    /// The bytes token `id` stands for (see the module doc); a special token's own text;
    /// empty for an id outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(piece) = self.id_to_token(id) else { return Vec::new() };
        if self.is_special_id(id) {
            return piece.into_bytes();
        }
        if let Some(b) = fallback_byte(&piece) {
            return vec![b];
        }
        if self.is_byte_level() {
            if let Some(bytes) = byte_level_bytes(&piece) {
                return bytes;
            }
        }
        piece.replace('▁', " ").into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_table_is_a_bijection_with_gpt2s_known_points() {
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(b'\n'), 'Ċ');
        assert_eq!(byte_char(b'a'), 'a');
        let chars: std::collections::HashSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(chars.len(), 256);
        for b in 0..=255u8 {
            assert_eq!(char_byte(byte_char(b)), Some(b));
        }
        assert_eq!(byte_level_bytes("Ġthe"), Some(b" the".to_vec()));
        assert_eq!(fallback_byte("<0x0A>"), Some(b'\n'));
        assert_eq!(fallback_byte("<0x0A"), None);
    }
}
