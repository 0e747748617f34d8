//! An encoded ContextAudit's block decisions read back without a protobuf library: a chat's
//! last prompt, as its next shift is made against it, straight from the stored audit. The
//! decisions are `AuditBlock`s (id 1, tokens 2, reason 3, kept 4), as the bindings write them
//! (`Plan.encode_ordered_decisions`).

use crate::wire::{fields, Value, WireError};

/// What a prompt kept, in order (id, tokens), and what it left out (id, reason).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Prompt {
    pub kept: Vec<(String, i64)>,
    pub excluded: Vec<(String, String)>,
}

/// Where an encoded ContextAudit holds its decisions, and its summary's id: the field numbers
/// from the audit down to the id (plan, summary, id).
pub struct AuditFields<'a> {
    pub blocks: u32,
    pub summary_id: &'a [u32],
}

/// The prompt an encoded ContextAudit records: the blocks it kept (its summary left out) and
/// those it left out; None when it left nothing out (a next shift carries only a cut).
pub fn previous_prompt(audit: &[u8], at: &AuditFields<'_>) -> Result<Option<Prompt>, WireError> {
    let mut prompt = Prompt::default();
    for field in fields(audit) {
        let field = field?;
        if let (true, Value::Bytes(block)) = (field.number == at.blocks, field.value) {
            let (id, tokens, reason, kept) = audit_block(block, offset_in(audit, block))?;
            if kept {
                prompt.kept.push((id, tokens));
            } else {
                prompt.excluded.push((id, reason));
            }
        }
    }
    if prompt.excluded.is_empty() {
        return Ok(None);
    }
    if let Some(summary) = last_string(audit, at.summary_id)? {
        prompt.kept.retain(|(id, _)| *id != summary);
    }
    Ok(Some(prompt))
}

/// One AuditBlock's id, tokens, reason and kept flag; its errors' offsets from `offset`, where
/// the block starts in the audit.
fn audit_block(block: &[u8], offset: usize) -> Result<(String, i64, String, bool), WireError> {
    let (mut id, mut tokens, mut reason, mut kept) = (String::new(), 0, String::new(), false);
    for field in fields(block) {
        let field = field.map_err(|e| e.within(offset))?;
        match (field.number, field.value) {
            (1, Value::Bytes(text)) => id = utf8(text, offset + field.span.start)?,
            (2, Value::Varint(value)) => tokens = value as i64, // int64: two's complement
            (3, Value::Bytes(text)) => reason = utf8(text, offset + field.span.start)?,
            (4, Value::Varint(value)) => kept = value != 0,
            _ => {}
        }
    }
    Ok((id, tokens, reason, kept))
}

/// The string at the end of `path` (nested fields' numbers), the last occurrence at each level
/// as protobuf parsers read a singular field: None when a message on the way is absent, empty
/// when the string itself is (proto3 writes no empty string).
fn last_string(message: &[u8], path: &[u32]) -> Result<Option<String>, WireError> {
    let Some((&last, messages)) = path.split_last() else { return Ok(None) };
    let mut at = message;
    for &number in messages {
        let Some(payload) = last_field(message, at, number)? else { return Ok(None) };
        at = payload;
    }
    match last_field(message, at, last)? {
        Some(text) => utf8(text, offset_in(message, text)).map(Some),
        None => Ok(Some(String::new())),
    }
}

/// The last occurrence of the length-delimited field `number` in `at`, a part of `message`.
fn last_field<'a>(message: &[u8], at: &'a [u8], number: u32) -> Result<Option<&'a [u8]>, WireError> {
    let base = offset_in(message, at);
    let mut found = None;
    for field in fields(at) {
        let field = field.map_err(|e| e.within(base))?;
        if let (true, Value::Bytes(payload)) = (field.number == number, field.value) {
            found = Some(payload);
        }
    }
    Ok(found)
}

/// Where `inner`, a slice of `outer`, starts in it.
fn offset_in(outer: &[u8], inner: &[u8]) -> usize {
    inner.as_ptr() as usize - outer.as_ptr() as usize
}

fn utf8(text: &[u8], offset: usize) -> Result<String, WireError> {
    String::from_utf8(text.to_vec()).map_err(|_| WireError { offset, reason: "a string field is not UTF-8" })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{put_bytes, put_varint};

    const AT: AuditFields<'static> = AuditFields { blocks: 5, summary_id: &[6, 18, 1] };

    fn block(id: &str, tokens: u64, reason: &str, kept: bool) -> Vec<u8> {
        let mut out = Vec::new();
        put_bytes(&mut out, 1, id.as_bytes());
        put_varint(&mut out, 2, tokens);
        put_bytes(&mut out, 3, reason.as_bytes());
        put_varint(&mut out, 4, u64::from(kept));
        out
    }

    fn audit(blocks: &[Vec<u8>], summary: Option<&str>) -> Vec<u8> {
        let mut out = Vec::new();
        put_bytes(&mut out, 1, b"generation");
        for b in blocks {
            put_bytes(&mut out, AT.blocks, b);
        }
        if let Some(id) = summary {
            let mut info = Vec::new();
            if !id.is_empty() {
                put_bytes(&mut info, 1, id.as_bytes()); // as proto3 writes it
            }
            let mut plan = Vec::new();
            put_varint(&mut plan, 3, 7);
            put_bytes(&mut plan, 18, &info);
            put_bytes(&mut out, 6, &plan);
        }
        out
    }

    #[test]
    fn a_prompt_that_left_nothing_out_is_none() {
        let kept = [block("a", 3, "KEPT", true), block("b", 0, "KEPT", true)];
        assert_eq!(previous_prompt(&audit(&kept, None), &AT), Ok(None));
        assert_eq!(previous_prompt(&[], &AT), Ok(None));
    }

    #[test]
    fn kept_in_order_with_tokens_excluded_with_reasons_summary_left_out() {
        let blocks = [
            block("old", 40, "BUDGET_OLDEST_FIRST", false),
            block("sum", 12, "SUMMARY", true),
            block("sys", 5, "PROTECTED", true),
            block("new", 0, "KEPT", true),
        ];
        let prompt = previous_prompt(&audit(&blocks, Some("sum")), &AT).unwrap().unwrap();
        assert_eq!(prompt.kept, vec![("sys".to_string(), 5), ("new".to_string(), 0)]);
        assert_eq!(prompt.excluded, vec![("old".to_string(), "BUDGET_OLDEST_FIRST".to_string())]);
        let unsummarized = previous_prompt(&audit(&blocks, None), &AT).unwrap().unwrap();
        assert_eq!(unsummarized.kept.len(), 3);
        // A summary whose id is empty (proto3 writes no empty string) leaves out blocks of that id.
        let empty_id = [block("", 1, "KEPT", true), block("old", 2, "BUDGET_OLDEST_FIRST", false)];
        let prompt = previous_prompt(&audit(&empty_id, Some("")), &AT).unwrap().unwrap();
        assert_eq!(prompt.kept, vec![]);
    }

    #[test]
    fn broken_audits_name_the_offset() {
        let mut bad = audit(&[block("blk", 1, "X", false)], None);
        let cut = bad.len() - 2;
        let head = 2 + "generation".len(); // where the block's field starts
        assert_eq!(
            previous_prompt(&bad[..cut], &AT),
            Err(WireError { offset: head, reason: "field runs past the end of the message" })
        );
        let at = bad.windows(3).position(|w| w == b"blk").unwrap();
        bad[at] = 0xff;
        assert_eq!(
            previous_prompt(&bad, &AT),
            Err(WireError { offset: at - 2, reason: "a string field is not UTF-8" })
        );
    }
}
