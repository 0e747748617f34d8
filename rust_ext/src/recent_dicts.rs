//! Recent requests read from dicts. An agent loop that keeps its messages as Python objects sends
//! the same objects every turn with one more at the end, and reading them again was most of a
//! shift from dicts: every value's type and text fetched from memory, the text copied. A request
//! sent again (its first and last objects where they were) is kept with the objects each block was
//! read from, held: a held object's address is not given to another object, and a str, int,
//! float, bool or None never changes. So a block of the next request that is the same dict holding
//! the same objects, down to every value, is the block read before, with its counts; from the first
//! block that is not, the request is read as before. Dicts, lists and tuples can change, so they
//! are compared entry by entry, never trusted. A caller that builds its messages anew each time,
//! their counts known, never has a request kept: it pays for noting two objects. A request whose
//! blocks the call will count is kept at once: recording its objects is then a small part of the
//! call (a percent of a first call on real text), and its second sight reads none of them.

use crate::convert::PyNode;
use contextshift_core::block_cache;
use contextshift_core::{
    extend_conversation, mostly_uncounted, parse_conversation, Block, CharCap, Conversation, Groups, IdHashes, Profile,
    Violation,
};
use pyo3::ffi;
use pyo3::prelude::*;
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard};

/// Requests kept at most (chats shifted in turn by one process), within a quarter of the block
/// cache's bound, as recent requests from JSON are.
const KEPT: usize = 8;
/// Containers nested deeper than this are not kept (the parser refuses them deeper still).
const MAX_DEPTH: usize = 32;

/// What a held object is: a value that never changes, or a container of `n` entries or items.
/// Sizes are u32 so a print is 16 bytes: the tape of 10k messages is written in the call that
/// first keeps them, and its fresh pages were a good part of that call's cost.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Held {
    Leaf,
    Dict(u32),
    Seq(u32),
}

/// The objects of a request's first blocks in the order a walk meets them (a dict's keys before
/// their values), each held, in one array (read in order: most of a request's memory traffic).
#[derive(Default)]
struct Prints {
    tape: Vec<(Py<PyAny>, Held)>,
    /// Where each block's objects end in `tape`.
    ends: Vec<usize>,
}

impl Prints {
    fn len(&self) -> usize {
        self.ends.len()
    }

    /// Appends `node`'s print; false (and nothing appended) when it holds anything but exact
    /// dicts, lists, tuples, strs, ints, floats, bools and None (a subclass may change), or keys
    /// that are not exact strs.
    fn push(&mut self, node: &PyNode<'_, '_>) -> bool {
        let start = self.tape.len();
        if !record(node.0, &mut self.tape, 0) {
            self.tape.truncate(start);
            return false;
        }
        self.ends.push(self.tape.len());
        true
    }

    /// Appends the prints of `nodes` from the first, up to one that may not be held. Room is made
    /// once, for as many objects a block as the first one took (within `bound` bytes, more than a
    /// request kept may hold): growing the tape by doubling copied it and touched twice the fresh
    /// memory.
    fn extend(&mut self, nodes: &[PyNode<'_, '_>], bound: usize) {
        let Some((first, rest)) = nodes.split_first() else { return };
        let before = self.tape.len();
        if !self.push(first) {
            return;
        }
        let objects = (self.tape.len() - before).saturating_mul(rest.len());
        self.ends.reserve(rest.len());
        self.tape.reserve(objects.min(bound / std::mem::size_of::<(Py<PyAny>, Held)>()));
        for node in rest {
            if !self.push(node) {
                return;
            }
        }
    }

    /// How many of `nodes`, from the first, are the objects printed and hold what they held.
    fn matching(&self, nodes: &[PyNode<'_, '_>]) -> usize {
        let mut at = 0;
        for (i, (node, &end)) in nodes.iter().zip(&self.ends).enumerate() {
            // The dicts are far apart in memory: ask for one a few blocks ahead while this one is read.
            if let Some(&ahead) = self.ends.get(i + PREFETCHED) {
                prefetch(self.tape.get(ahead).map_or(ptr::null_mut(), |(o, _)| o.as_ptr()));
            }
            if !(same(node.0.as_ptr(), &self.tape[..end], &mut at) && at == end) {
                return i;
            }
        }
        nodes.len().min(self.len())
    }

    /// The first `n` blocks' prints; the rest returned.
    fn split_off(&mut self, n: usize) -> Prints {
        let start = if n == 0 { 0 } else { self.ends[n - 1] };
        let tape = self.tape.split_off(start);
        let ends = self.ends.split_off(n).into_iter().map(|end| end - start).collect();
        Prints { tape, ends }
    }
}

/// Blocks ahead whose dict is fetched early.
const PREFETCHED: usize = 4;

fn prefetch(obj: *mut ffi::PyObject) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(obj.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = obj;
}

fn is_leaf(ty: *mut ffi::PyTypeObject, obj: *mut ffi::PyObject) -> bool {
    // SAFETY: only the addresses of the interpreter's static type objects and of None are taken.
    unsafe {
        ty == ptr::addr_of_mut!(ffi::PyUnicode_Type)
            || ty == ptr::addr_of_mut!(ffi::PyLong_Type)
            || ty == ptr::addr_of_mut!(ffi::PyFloat_Type)
            || ty == ptr::addr_of_mut!(ffi::PyBool_Type)
            || obj == ffi::Py_None()
    }
}

/// What `obj` is, if it may be held; its size for a container.
fn held(obj: *mut ffi::PyObject) -> Option<Held> {
    // SAFETY: the GIL is held and `obj` is a live object; its type decides which size call is valid.
    unsafe {
        let ty = ffi::Py_TYPE(obj);
        if ty == ptr::addr_of_mut!(ffi::PyDict_Type) {
            u32::try_from(ffi::PyDict_Size(obj)).ok().map(Held::Dict)
        } else if ty == ptr::addr_of_mut!(ffi::PyList_Type) {
            u32::try_from(ffi::PyList_Size(obj)).ok().map(Held::Seq)
        } else if ty == ptr::addr_of_mut!(ffi::PyTuple_Type) {
            u32::try_from(ffi::PyTuple_Size(obj)).ok().map(Held::Seq)
        } else {
            is_leaf(ty, obj).then_some(Held::Leaf)
        }
    }
}

/// The item at `i` of list or tuple `obj` (borrowed).
///
/// SAFETY (callers): the GIL is held, `obj` is a list or tuple and `i` is in range.
unsafe fn item(obj: *mut ffi::PyObject, i: isize) -> *mut ffi::PyObject {
    if ffi::PyList_Check(obj) != 0 {
        ffi::PyList_GetItem(obj, i)
    } else {
        ffi::PyTuple_GetItem(obj, i)
    }
}

/// Appends `obj` and what it holds to `tape`; false if any of it may not be held.
fn record(obj: Borrowed<'_, '_, PyAny>, tape: &mut Vec<(Py<PyAny>, Held)>, depth: usize) -> bool {
    let py = obj.py();
    let Some(held) = held(obj.as_ptr()) else { return false };
    if held != Held::Leaf && depth >= MAX_DEPTH {
        return false;
    }
    tape.push((obj.to_owned().unbind(), held));
    // SAFETY: the GIL is held, `held` says what `obj` is, and nothing here runs Python code.
    unsafe {
        match held {
            Held::Leaf => true,
            Held::Dict(_) => {
                let (mut pos, mut key, mut value) = (0, ptr::null_mut(), ptr::null_mut());
                while ffi::PyDict_Next(obj.as_ptr(), &mut pos, &mut key, &mut value) != 0 {
                    let key = Borrowed::from_ptr(py, key);
                    if ffi::Py_TYPE(key.as_ptr()) != ptr::addr_of_mut!(ffi::PyUnicode_Type) {
                        return false;
                    }
                    tape.push((key.to_owned().unbind(), Held::Leaf));
                    if !record(Borrowed::from_ptr(py, value), tape, depth + 1) {
                        return false;
                    }
                }
                true
            }
            Held::Seq(len) => {
                (0..len as isize).all(|i| record(Borrowed::from_ptr(py, item(obj.as_ptr(), i)), tape, depth + 1))
            }
        }
    }
}

/// Whether `obj` is `tape[*at]` and holds what it held then (advancing `at` past it). A held
/// leaf is the same value by its address alone; its memory is not read.
fn same(obj: *mut ffi::PyObject, tape: &[(Py<PyAny>, Held)], at: &mut usize) -> bool {
    let Some((object, held)) = tape.get(*at) else { return false };
    *at += 1;
    if object.as_ptr() != obj {
        return false;
    }
    if *held != Held::Leaf && self::held(obj) != Some(*held) {
        return false; // a container of another size now
    }
    // SAFETY: `obj` is the held object, so of the type `held` names; the GIL is held and nothing
    // here runs Python code.
    unsafe {
        match *held {
            Held::Leaf => true,
            Held::Dict(_) => {
                let (mut pos, mut key, mut value) = (0, ptr::null_mut(), ptr::null_mut());
                while ffi::PyDict_Next(obj, &mut pos, &mut key, &mut value) != 0 {
                    let key_held = tape.get(*at).is_some_and(|(k, _)| k.as_ptr() == key);
                    *at += 1;
                    if !(key_held && same(value, tape, at)) {
                        return false;
                    }
                }
                true
            }
            Held::Seq(len) => (0..len as isize).all(|i| same(item(obj, i), tape, at)),
        }
    }
}

/// A request as read: its first blocks' prints (up to one that may not be held), its
/// conversation and groups, under `cap`.
struct Recent {
    prints: Prints,
    conversation: Conversation,
    groups: Arc<Groups>,
    /// Its ids' hashes, once it extended another request (a request read whole has not made them).
    ids: Option<IdHashes>,
    cap: CharCap,
    /// What it holds up to each block: the parsed block (its text and a few words) and a handle
    /// a held object.
    sizes: Vec<usize>,
}

impl Recent {
    /// Keeps `prints` with `conversation`, whose first blocks' sizes are `sizes`.
    fn new(
        prints: Prints,
        conversation: Conversation,
        groups: Arc<Groups>,
        ids: Option<IdHashes>,
        cap: CharCap,
        mut sizes: Vec<usize>,
    ) -> Recent {
        let handle = std::mem::size_of::<(Py<PyAny>, Held)>();
        let id_hash = 2 * std::mem::size_of::<u64>(); // at most, in its hash set
        for i in sizes.len()..prints.len() {
            let block = &conversation.blocks[i];
            let objects = prints.ends[i] - if i == 0 { 0 } else { prints.ends[i - 1] };
            let size = std::mem::size_of::<Block>() + block.id.len() + block.text_bytes() + objects * handle + id_hash;
            sizes.push(sizes.last().copied().unwrap_or(0) + size);
        }
        Recent { prints, conversation, groups, ids, cap, sizes }
    }

    fn bytes(&self) -> usize {
        self.sizes.last().copied().unwrap_or(0)
    }

    fn first(&self) -> *mut ffi::PyObject {
        self.prints.tape.first().map_or(ptr::null_mut(), |(o, _)| o.as_ptr())
    }
}

/// A request read whole and not kept: its first and last objects, held. A later request with
/// both at the same places (objects sent again, as an agent loop sends them) is kept; a caller that
/// builds its messages anew every time pays for two references, not for holding every object.
struct Seen {
    first: Py<PyAny>,
    last: Py<PyAny>,
    len: usize,
    cap: CharCap,
}

impl Seen {
    fn is_opening_of(&self, nodes: &[PyNode<'_, '_>], cap: CharCap) -> bool {
        self.cap == cap
            && self.len <= nodes.len()
            && self.first.as_ptr() == nodes[0].0.as_ptr()
            && self.last.as_ptr() == nodes[self.len - 1].0.as_ptr()
    }
}

/// Requests kept and seen, most recently used last. Locked only to take or put one: never while
/// Python code may run or the GIL is released (a thread waiting for this lock holds the GIL).
struct Kept {
    requests: Vec<Recent>,
    seen: Vec<Seen>,
}

static KEPT_REQUESTS: Mutex<Kept> = Mutex::new(Kept { requests: Vec::new(), seen: Vec::new() });

fn kept() -> MutexGuard<'static, Kept> {
    KEPT_REQUESTS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Drops every kept request (with the block cache: the count memo lives in the blocks).
pub(crate) fn clear() {
    let mut kept = kept();
    let dropped = (std::mem::take(&mut kept.requests), std::mem::take(&mut kept.seen));
    drop(kept);
    drop(dropped); // after the lock: releasing the held objects may run Python code
}

/// Reads `nodes` as `parse_conversation` does, taking the blocks of a recent request whose objects
/// they are; the request is kept for the next one once its objects are seen sent again, or at once
/// when the call will count most of its blocks under `counted_with` (their counts not cached): the
/// tokenizer's work then makes recording its objects a small part of the call, and the next call
/// on them (a loop's next turn, the same request again) reads none of them again.
pub(crate) fn read(
    py: Python<'_>,
    nodes: &[PyNode<'_, '_>],
    cap: CharCap,
    counted_with: Option<&Profile>,
) -> Result<(Conversation, Arc<Groups>), Vec<Violation>> {
    let bound = block_cache::global().capacity_bytes() / 4;
    if bound == 0 || nodes.is_empty() {
        return parse_conversation(nodes, cap, "blocks").map(|conversation| with_groups(py, conversation, None));
    }
    let (prior, seen) = {
        let mut kept = kept();
        let first = nodes[0].0.as_ptr();
        let prior = kept.requests.iter().rposition(|r| r.first() == first && r.cap == cap);
        let prior = prior.map(|at| kept.requests.remove(at));
        let seen = kept.seen.iter().position(|s| s.is_opening_of(nodes, cap));
        (prior, seen.map(|at| kept.seen.remove(at)))
    };
    let reused = prior.as_ref().map_or(0, |p| p.prints.matching(nodes));
    // Objects no longer held, let go last: releasing an object may run Python code, which must not
    // run while `nodes` (borrowed) are read.
    let mut retired = (Vec::new(), seen);
    let (conversation, ids, mut prints, sizes, groups_before) = match prior {
        Some(prior) if reused == nodes.len() && reused == prior.conversation.blocks.len() => {
            // The very request again: its reading as it is.
            let read = (prior.conversation.clone(), Arc::clone(&prior.groups));
            put(prior, bound);
            return Ok(read);
        }
        // At least half of what it holds taken: an agent loop's next turn.
        Some(mut prior) if reused > 0 && reused * 2 >= prior.prints.len() => {
            let before = (Arc::clone(&prior.groups), prior.conversation.blocks.len());
            // Its list cut in place when the last shift's result is gone (as a loop's usually is).
            let known = std::mem::take(&mut prior.conversation).into_prefix(reused);
            let extended = extend_conversation(known, prior.ids.take(), &nodes[reused..], cap, "blocks");
            let (conversation, ids) = match extended {
                Ok(extended) => extended,
                Err(known) => {
                    let whole = parse_conversation(nodes, cap, "blocks"); // says what is wrong
                    if reused == before.1 {
                        // This request is refused; the next may extend the kept one again.
                        prior.conversation = known;
                        put(prior, bound);
                    } else {
                        retired.0.push(prior.prints); // its blocks past `reused` are gone
                    }
                    return whole.map(|conversation| with_groups(py, conversation, None));
                }
            };
            retired.0.push(prior.prints.split_off(reused));
            prior.sizes.truncate(reused);
            (conversation, Some(ids), prior.prints, prior.sizes, (reused == before.1).then_some(before))
        }
        prior => {
            retired.0.extend(prior.map(|p| p.prints));
            let conversation = parse_conversation(nodes, cap, "blocks")?;
            let counts_now =
                counted_with.is_some_and(|profile| mostly_uncounted(profile, conversation.blocks.as_slice()));
            if retired.1.is_none() && !counts_now {
                // New objects whose counts are known: noted, not kept, until they are sent again.
                let last = nodes.len() - 1;
                let (first, last_held) = (nodes[0].0.to_owned().unbind(), nodes[last].0.to_owned().unbind());
                let noted = note(Seen { first, last: last_held, len: nodes.len(), cap });
                let read = with_groups(py, conversation, None);
                drop((retired, noted));
                return Ok(read);
            }
            (conversation, None, Prints::default(), Vec::new(), None)
        }
    };
    prints.extend(&nodes[prints.len()..], bound);
    // No Python object is read from here on.
    let (conversation, groups) = with_groups(py, conversation, groups_before);
    put(Recent::new(prints, conversation.clone(), Arc::clone(&groups), ids, cap, sizes), bound);
    drop(retired);
    Ok((conversation, groups))
}

/// Notes `seen` as the most recently seen request; what it pushes out is returned, to be let go
/// once nothing borrowed is read.
fn note(seen: Seen) -> Vec<Seen> {
    let mut kept = kept();
    kept.seen.push(seen);
    let over = kept.seen.len().saturating_sub(KEPT);
    kept.seen.drain(..over).collect()
}

/// `conversation` and its groups: those of the request it extends (`before`: the groups and how
/// many blocks they cover) where they carry over, else built (without the GIL).
fn with_groups(
    py: Python<'_>,
    conversation: Conversation,
    before: Option<(Arc<Groups>, usize)>,
) -> (Conversation, Arc<Groups>) {
    let groups = match before {
        Some((groups, n)) if n == conversation.blocks.len() => Some(groups),
        Some((groups, _)) => groups.extended(&conversation.blocks).map(Arc::new),
        None => None,
    };
    let groups = groups.unwrap_or_else(|| Arc::new(py.detach(|| Groups::build(&conversation.blocks))));
    (conversation, groups)
}

/// Keeps `request` as the most recent, dropping the least recent ones over `KEPT` or `bound`.
fn put(request: Recent, bound: usize) {
    if request.prints.len() == 0 || request.bytes() > bound {
        return;
    }
    let mut kept = kept();
    kept.requests.push(request);
    let mut total: usize = kept.requests.iter().map(Recent::bytes).sum();
    let mut dropped = Vec::new();
    while kept.requests.len() > KEPT || total > bound {
        let oldest = kept.requests.remove(0);
        total -= oldest.bytes();
        dropped.push(oldest);
    }
    drop(kept);
    drop(dropped);
}
