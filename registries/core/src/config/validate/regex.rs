//! RE2 checks for every user regex that reaches Envoy.
//!
//! Envoy compiles `safe_regex` patterns with RE2, and a pattern RE2 refuses (or one
//! whose compiled program is over Envoy's size limit) makes the proxy NACK the whole
//! resource. istiod checks patterns with Go's `regexp`, which follows RE2's syntax and
//! limits. The `regex` crate is not RE2: it accepts repeat counts RE2 refuses and
//! syntax RE2 does not have, so the pattern is parsed with `regex-syntax` and then held
//! to RE2's rules here:
//!
//! * syntax RE2 refuses is refused: look-around and back-references (regex-syntax
//!   refuses them too), the `x` and `R` flags, `\u`/`\U` escapes, `\p{name=value}`
//!   and property names that are neither a general category nor a script (RE2 is case
//!   sensitive there), and a repetition operator straight after another (`a**`, the
//!   possessive `a*+`, `a{2}{3}`);
//! * syntax RE2 reads as literal text but regex-syntax does not is refused as
//!   ambiguous: the `\<`, `\>` and `\b{...}` word assertions, class set operations
//!   (`&&`, `--`, `~~`), nested classes, spaces inside `{...}`; and `\C` (RE2's any
//!   byte), which Go's `regexp`, istiod's, refuses;
//! * no counted repetition may exceed [`MAX_REPEAT`] (`{n}`, `{n,}`, `{n,m}`), and
//!   nested counted repetitions may not multiply past it either: RE2's parser divides
//!   1000 by the count of each `{...}` on the way down (its `RepetitionWalker`) and
//!   refuses the pattern when that reaches zero, so `(a{10}){100}` passes and
//!   `(a{10}){101}` does not;
//! * the compiled program may not exceed [`MAX_PROGRAM_SIZE`] instructions; see
//!   [`program_size`] for how the size is estimated.
//!
//! The other way round, a few things RE2 takes are refused here because regex-syntax
//! does not parse them: `\Q...\E`, `\p{^Greek}`, octal escapes such as `\0`, and a `{`
//! that opens no repetition (RE2 reads `a{,3}` and `x{y}` as literal text). Each has a
//! plain spelling (escape the text, `\P{Greek}`, `\x00`, `\{`).

use regex_syntax::ast::{self, Ast};
use regex_syntax::hir::{self, Hir, HirKind};

/// RE2's `kMaxRepeat` (`maximum_repeat_count` in `re2/parse.cc`): the largest count a
/// `{n,m}` may carry, and the budget nested counts divide.
pub const MAX_REPEAT: u32 = 1000;

/// The largest RE2 program Envoy accepts from istiod-managed config.
///
/// Envoy refuses a regex whose `RE2::ProgramSize()` exceeds the runtime value
/// `re2.max_program_size.error_level` (default 100 in Envoy, `source/common/common/
/// regex.cc`). Istio's proxy bootstrap raises it to 32768 (`pkg/bootstrap/config.go`,
/// `extractRuntimeFlags`), and meshfed serves Istio's proxies, so this is the limit
/// their Envoys enforce.
pub const MAX_PROGRAM_SIZE: u64 = 32768;

/// The longest pattern Istio accepts (`validateStringRegexp`).
pub const MAX_PATTERN_LEN: usize = 1024;

/// Checks `re` as Envoy's RE2 would, with the length limit Istio adds. The error reads
/// like Istio's (`invalid regex ...; Istio uses RE2 style regex-based match`).
pub fn validate_re2(re: &str) -> Result<(), String> {
    if re.is_empty() {
        return Err("regex string match should not be empty".to_string());
    }
    if re.len() > MAX_PATTERN_LEN {
        return Err(format!(
            "regex is too large, max length allowed is {MAX_PATTERN_LEN}"
        ));
    }
    check(re).map_err(|why| {
        format!(
            "invalid regex {re:?}: {why}; Istio uses RE2 style regex-based match (https://github.com/google/re2/wiki/Syntax)"
        )
    })
}

fn check(re: &str) -> Result<(), String> {
    let mut tree = ast::parse::ParserBuilder::new()
        .octal(false)
        .ignore_whitespace(false)
        .build()
        .parse(re)
        .map_err(|e| e.kind().to_string())?;
    check_syntax(&tree, re)?;
    check_repeats(&tree)?;
    // RE2's \d, \s and \w are ASCII; regex-syntax's are Unicode. Size the ASCII ones.
    asciify_perl_classes(&mut tree);
    let hir = hir::translate::TranslatorBuilder::new()
        .unicode(true)
        .utf8(true)
        .build()
        .translate(re, &tree)
        .map_err(|e| e.kind().to_string())?;
    let size = program_size(&hir);
    if size > MAX_PROGRAM_SIZE {
        return Err(format!(
            "RE2 program size of about {size} > max program size of {MAX_PROGRAM_SIZE}"
        ));
    }
    Ok(())
}

// === syntax ===

/// RE2's general categories (`\pL`, `\p{Lu}`); `Any` is RE2's own.
const GENERAL_CATEGORIES: &[&str] = &[
    "Any", "C", "Cc", "Cf", "Co", "Cs", "L", "Ll", "Lm", "Lo", "Lt", "Lu", "M", "Mc", "Me", "Mn",
    "N", "Nd", "Nl", "No", "P", "Pc", "Pd", "Pe", "Pf", "Pi", "Po", "Ps", "S", "Sc", "Sk", "Sm",
    "So", "Z", "Zl", "Zp", "Zs",
];

fn check_syntax(node: &Ast, re: &str) -> Result<(), String> {
    match node {
        Ast::Empty(_) | Ast::Dot(_) | Ast::ClassPerl(_) => Ok(()),
        Ast::Flags(set) => check_flags(&set.flags),
        Ast::Literal(lit) => check_literal(lit),
        Ast::Assertion(a) => check_assertion(a),
        Ast::ClassUnicode(c) => check_unicode_class(c),
        Ast::ClassBracketed(c) => check_bracketed(c, true),
        Ast::Repetition(rep) => {
            let op = &re[rep.op.span.start.offset..rep.op.span.end.offset];
            if let ast::RepetitionKind::Range(_) = rep.op.kind
                && op.contains(char::is_whitespace)
            {
                return Err(format!(
                    "RE2 reads {op} as literal text, not a repetition (no spaces inside the braces)"
                ));
            }
            if let Ast::Repetition(inner) = &*rep.ast {
                // `a**`, `a*+` (possessive elsewhere), `a{2}{3}`: RE2 says "bad
                // repetition operator"; regex-syntax reads them as nested repeats.
                let inner = &re[inner.op.span.start.offset..inner.op.span.end.offset];
                return Err(format!(
                    "bad repetition operator: {inner}{op} (RE2 does not repeat a repetition without a group)"
                ));
            }
            check_syntax(&rep.ast, re)
        }
        Ast::Group(g) => {
            if let ast::GroupKind::NonCapturing(flags) = &g.kind {
                check_flags(flags)?;
            }
            check_syntax(&g.ast, re)
        }
        Ast::Alternation(alt) => alt.asts.iter().try_for_each(|a| check_syntax(a, re)),
        Ast::Concat(cat) => cat.asts.iter().try_for_each(|a| check_syntax(a, re)),
    }
}

fn check_flags(flags: &ast::Flags) -> Result<(), String> {
    for item in &flags.items {
        if let ast::FlagsItemKind::Flag(flag) = &item.kind {
            let name = match flag {
                ast::Flag::IgnoreWhitespace => 'x',
                ast::Flag::CRLF => 'R',
                ast::Flag::Unicode => 'u',
                _ => continue,
            };
            return Err(format!("RE2 has no {name:?} flag (it knows i, m, s and U)"));
        }
    }
    Ok(())
}

fn check_literal(lit: &ast::Literal) -> Result<(), String> {
    match &lit.kind {
        ast::LiteralKind::HexFixed(ast::HexLiteralKind::UnicodeShort)
        | ast::LiteralKind::HexFixed(ast::HexLiteralKind::UnicodeLong)
        | ast::LiteralKind::HexBrace(ast::HexLiteralKind::UnicodeShort)
        | ast::LiteralKind::HexBrace(ast::HexLiteralKind::UnicodeLong) => {
            Err("RE2 has no \\u or \\U escapes (write \\x{...})".to_string())
        }
        _ => Ok(()),
    }
}

fn check_assertion(a: &ast::Assertion) -> Result<(), String> {
    use ast::AssertionKind as K;
    match a.kind {
        K::StartLine
        | K::EndLine
        | K::StartText
        | K::EndText
        | K::WordBoundary
        | K::NotWordBoundary => Ok(()),
        _ => Err(
            "RE2 has no \\<, \\> or \\b{...} assertions: it reads them as literal text (it knows ^, $, \\A, \\z, \\b and \\B)"
                .to_string(),
        ),
    }
}

fn check_unicode_class(c: &ast::ClassUnicode) -> Result<(), String> {
    match &c.kind {
        ast::ClassUnicodeKind::OneLetter(l) => {
            if GENERAL_CATEGORIES.contains(&l.to_string().as_str()) {
                Ok(())
            } else {
                Err(format!("RE2 has no Unicode class \\p{l}"))
            }
        }
        ast::ClassUnicodeKind::Named(name) => {
            let name = name.strip_prefix('^').unwrap_or(name);
            if GENERAL_CATEGORIES.contains(&name) || is_script_name(name) {
                Ok(())
            } else {
                Err(format!(
                    "RE2 has no Unicode class \\p{{{name}}} (it knows general categories and scripts)"
                ))
            }
        }
        ast::ClassUnicodeKind::NamedValue { .. } => {
            Err("RE2 has no \\p{name=value} classes".to_string())
        }
    }
}

/// A script as RE2 spells it: `Greek`, `Old_Italic` (RE2 is case sensitive here,
/// regex-syntax is not, so the spelling is checked before regex-syntax is asked).
fn is_script_name(name: &str) -> bool {
    let canonical = name.split('_').all(|word| {
        let mut chars = word.chars();
        chars.next().is_some_and(|c| c.is_ascii_uppercase())
            && chars.all(|c| c.is_ascii_lowercase())
    });
    // Four letters is also the shape of an ISO 15924 code (`Grek`), which regex-syntax
    // takes and RE2 does not; these are the scripts whose names have four letters.
    const FOUR_LETTER_NAMES: &[&str] = &[
        "Ahom", "Cham", "Kawi", "Lisu", "Modi", "Newa", "Thai", "Toto",
    ];
    canonical
        && (name.len() != 4 || FOUR_LETTER_NAMES.contains(&name))
        && regex_syntax::parse(&format!("\\p{{sc={name}}}")).is_ok()
}

fn check_bracketed(c: &ast::ClassBracketed, top: bool) -> Result<(), String> {
    if !top {
        return Err(
            "RE2 has no nested character classes: it reads a [ inside a class as a literal (write \\[)".to_string(),
        );
    }
    match &c.kind {
        ast::ClassSet::BinaryOp(_) => {
            Err("RE2 has no class set operations: it reads &&, -- and ~~ in a class as literals (escape them)".to_string())
        }
        ast::ClassSet::Item(item) => check_class_item(item),
    }
}

fn check_class_item(item: &ast::ClassSetItem) -> Result<(), String> {
    match item {
        ast::ClassSetItem::Literal(lit) => check_literal(lit),
        ast::ClassSetItem::Range(r) => check_literal(&r.start).and(check_literal(&r.end)),
        ast::ClassSetItem::Unicode(u) => check_unicode_class(u),
        ast::ClassSetItem::Bracketed(b) => check_bracketed(b, false),
        ast::ClassSetItem::Union(u) => u.items.iter().try_for_each(check_class_item),
        ast::ClassSetItem::Empty(_) | ast::ClassSetItem::Ascii(_) | ast::ClassSetItem::Perl(_) => {
            Ok(())
        }
    }
}

// === repetition counts ===

/// RE2's two repeat rules: every count at most [`MAX_REPEAT`], and, under every
/// counted repetition of at least 2, the budget left after dividing [`MAX_REPEAT`] by
/// the counts on each path down is never zero.
fn check_repeats(node: &Ast) -> Result<(), String> {
    if let Ast::Repetition(rep) = node
        && let ast::RepetitionKind::Range(range) = &rep.op.kind
    {
        let (min, max) = bounds(range);
        if min > MAX_REPEAT || max.is_some_and(|m| m > MAX_REPEAT) {
            return Err(format!(
                "invalid repetition size: {} (RE2 allows at most {MAX_REPEAT})",
                show(range)
            ));
        }
        if (min >= 2 || max.is_some_and(|m| m >= 2)) && repeat_budget(node, MAX_REPEAT) == 0 {
            return Err(format!(
                "invalid repetition size: {} (nested repetition counts multiply past RE2's limit of {MAX_REPEAT})",
                show(range)
            ));
        }
    }
    children(node).try_for_each(check_repeats)
}

fn bounds(range: &ast::RepetitionRange) -> (u32, Option<u32>) {
    match *range {
        ast::RepetitionRange::Exactly(n) => (n, Some(n)),
        ast::RepetitionRange::AtLeast(n) => (n, None),
        ast::RepetitionRange::Bounded(n, m) => (n, Some(m)),
    }
}

fn show(range: &ast::RepetitionRange) -> String {
    match *range {
        ast::RepetitionRange::Exactly(n) => format!("{{{n}}}"),
        ast::RepetitionRange::AtLeast(n) => format!("{{{n},}}"),
        ast::RepetitionRange::Bounded(n, m) => format!("{{{n},{m}}}"),
    }
}

/// The smallest budget left anywhere under `node` (RE2's `RepetitionWalker`): each
/// counted repetition divides the budget by its maximum (its minimum when unbounded).
fn repeat_budget(node: &Ast, budget: u32) -> u32 {
    let mut budget = budget;
    if let Ast::Repetition(rep) = node
        && let ast::RepetitionKind::Range(range) = &rep.op.kind
    {
        let (min, max) = bounds(range);
        // A count of 0 leaves the budget as it is.
        budget = budget.checked_div(max.unwrap_or(min)).unwrap_or(budget);
    }
    children(node)
        .map(|child| repeat_budget(child, budget))
        .fold(budget, u32::min)
}

fn children(node: &Ast) -> Box<dyn Iterator<Item = &Ast> + '_> {
    match node {
        Ast::Repetition(rep) => Box::new(std::iter::once(&*rep.ast)),
        Ast::Group(g) => Box::new(std::iter::once(&*g.ast)),
        Ast::Alternation(alt) => Box::new(alt.asts.iter()),
        Ast::Concat(cat) => Box::new(cat.asts.iter()),
        _ => Box::new(std::iter::empty()),
    }
}

fn asciify_perl_classes(node: &mut Ast) {
    let ascii = |perl: &ast::ClassPerl, negated: bool| ast::ClassAscii {
        span: perl.span,
        kind: match perl.kind {
            ast::ClassPerlKind::Digit => ast::ClassAsciiKind::Digit,
            ast::ClassPerlKind::Space => ast::ClassAsciiKind::Space,
            ast::ClassPerlKind::Word => ast::ClassAsciiKind::Word,
        },
        negated,
    };
    match node {
        Ast::ClassPerl(perl) => {
            *node = Ast::ClassBracketed(Box::new(ast::ClassBracketed {
                span: perl.span,
                negated: perl.negated,
                kind: ast::ClassSet::Item(ast::ClassSetItem::Ascii(ascii(perl, false))),
            }));
        }
        Ast::ClassBracketed(class) => {
            if let ast::ClassSet::Item(item) = &mut class.kind {
                asciify_item(item, &ascii);
            }
        }
        Ast::Repetition(rep) => asciify_perl_classes(&mut rep.ast),
        Ast::Group(g) => asciify_perl_classes(&mut g.ast),
        Ast::Alternation(alt) => alt.asts.iter_mut().for_each(asciify_perl_classes),
        Ast::Concat(cat) => cat.asts.iter_mut().for_each(asciify_perl_classes),
        _ => {}
    }
}

fn asciify_item(
    item: &mut ast::ClassSetItem,
    ascii: &impl Fn(&ast::ClassPerl, bool) -> ast::ClassAscii,
) {
    match item {
        ast::ClassSetItem::Perl(perl) => {
            *item = ast::ClassSetItem::Ascii(ascii(perl, perl.negated));
        }
        ast::ClassSetItem::Union(u) => u.items.iter_mut().for_each(|i| asciify_item(i, ascii)),
        _ => {}
    }
}

// === program size ===

/// An estimate of `RE2::ProgramSize()`, the instruction count of the compiled program,
/// meant never to fall short of it. It follows how RE2 compiles (`re2/compile.cc`) and
/// then flattens the program, where the split instructions of alternations and loops
/// become lists and no longer count:
///
/// * four fixed instructions (fail, match, and the `.*?` loop of unanchored search);
/// * a literal byte, a look-around (`^`, `$`, `\b`) and an empty match are one each, a
///   capture group two (its start and end), an alternation nothing beyond its branches;
/// * `x*` costs `x`, `x+` and `x?` one more than `x`; `x{n,m}` is expanded as RE2
///   expands it, n copies of `x` then m - n optional copies, and `x{n,}` is n - 1 copies
///   then `x+`;
/// * a character class is its UTF-8 byte-range automaton as RE2 builds it: ranges split
///   where their UTF-8 forms change length or lead bytes, each sequence built from its
///   last byte backwards sharing continuation instructions with the sequences before
///   it; 0x80-0x10FFFF in RE2's short form (six instructions); and the ASCII case-fold
///   shortcut (a class that treats A-Z as it treats a-z drops its A-Z ranges).
///
/// What it leaves out makes it larger than RE2's count, never smaller: RE2 also strips a
/// `^literal` prefix and the anchors from the program, and factors common prefixes out
/// of alternations. Against RE2 itself (the pattern sets in the tests) it is exact for
/// classes and counted repeats, and over by the stripped and factored parts.
pub fn program_size(hir: &Hir) -> u64 {
    const FIXED: u64 = 4;
    FIXED.saturating_add(size(hir))
}

fn size(hir: &Hir) -> u64 {
    match hir.kind() {
        HirKind::Empty => 1,
        HirKind::Literal(lit) => lit.0.len() as u64,
        HirKind::Class(hir::Class::Unicode(class)) => {
            let ranges = class
                .ranges()
                .iter()
                .map(|r| (u32::from(r.start()), u32::from(r.end())));
            class_size(ranges.collect())
        }
        HirKind::Class(hir::Class::Bytes(class)) => class.ranges().len().max(1) as u64,
        HirKind::Look(_) => 1,
        HirKind::Capture(cap) => size(&cap.sub).saturating_add(2),
        HirKind::Concat(subs) | HirKind::Alternation(subs) => {
            subs.iter().map(size).fold(0, u64::saturating_add)
        }
        HirKind::Repetition(rep) => {
            let x = size(&rep.sub);
            let min = u64::from(rep.min);
            match rep.max {
                None if min <= 1 => x.saturating_add(1),
                None => (min - 1).saturating_mul(x).saturating_add(x + 1),
                Some(max) => {
                    let max = u64::from(max);
                    min.saturating_mul(x)
                        .saturating_add((max - min).saturating_mul(x.saturating_add(1)))
                }
            }
        }
    }
}

/// The instructions of one character class (code point ranges, sorted).
fn class_size(ranges: Vec<(u32, u32)>) -> u64 {
    // RE2's classes run over every code point, surrogates too; regex-syntax's skip the
    // surrogates, which splits a negated class in two where RE2 has one range.
    let mut merged: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
    for (lo, hi) in ranges {
        match merged.last_mut() {
            Some(last) if last.1 + 1 == lo || (last.1 == 0xD7FF && lo == 0xE000) => last.1 = hi,
            _ => merged.push((lo, hi)),
        }
    }
    if merged.is_empty() {
        return 1; // a fail instruction
    }
    let contains = |c: u32| merged.iter().any(|&(lo, hi)| lo <= c && c <= hi);
    let folds_ascii = (u32::from(b'a')..=u32::from(b'z')).all(|c| contains(c) == contains(c - 32));
    let mut automaton = Utf8Automaton::default();
    for (lo, hi) in merged {
        if folds_ascii && u32::from(b'A') <= lo && hi <= u32::from(b'Z') {
            continue;
        }
        automaton.add_range(lo, hi);
    }
    automaton.instructions
}

/// RE2's UTF-8 range compiler, counting instructions only.
#[derive(Default)]
struct Utf8Automaton {
    /// Shared continuation instructions: (low byte, high byte, next) -> id; next 0 is
    /// "match".
    suffixes: std::collections::HashMap<(u8, u8, u64), u64>,
    instructions: u64,
}

impl Utf8Automaton {
    fn add_range(&mut self, lo: u32, hi: u32) {
        if lo > hi {
            return;
        }
        if (lo, hi) == (0x80, 0x10FFFF) {
            // RE2's short form: C2-DF, E0-EF and F0-F4 leads over three shared
            // continuation bytes (allowing overlong and out-of-range forms).
            self.add_sequence(&[(0xC2, 0xDF), (0x80, 0xBF)]);
            self.add_sequence(&[(0xE0, 0xEF), (0x80, 0xBF), (0x80, 0xBF)]);
            self.add_sequence(&[(0xF0, 0xF4), (0x80, 0xBF), (0x80, 0xBF), (0x80, 0xBF)]);
            return;
        }
        // Split where the encoded length changes.
        for max in [0x7F, 0x7FF, 0xFFFF] {
            if lo <= max && max < hi {
                self.add_range(lo, max);
                self.add_range(max + 1, hi);
                return;
            }
        }
        if hi < 0x80 {
            self.instructions += 1;
            return;
        }
        // Split until every byte position spans one range.
        let len = utf8(lo).len();
        for i in 1..len {
            let m = (1u32 << (6 * i)) - 1;
            if lo & !m != hi & !m {
                if lo & m != 0 {
                    self.add_range(lo, lo | m);
                    self.add_range((lo | m) + 1, hi);
                    return;
                }
                if hi & m != m {
                    self.add_range(lo, (hi & !m) - 1);
                    self.add_range(hi & !m, hi);
                    return;
                }
            }
        }
        let (a, b) = (utf8(lo), utf8(hi));
        let seq: Vec<(u8, u8)> = a.into_iter().zip(b).collect();
        self.add_sequence(&seq);
    }

    /// Builds a sequence from its last byte range: the lead instruction is always new
    /// and so is a middle one of a single byte (RE2 caches neither); the rest are
    /// shared with earlier sequences that continue the same way.
    fn add_sequence(&mut self, seq: &[(u8, u8)]) {
        let mut next = 0;
        for (i, &(lo, hi)) in seq.iter().enumerate().rev() {
            let cached = i != 0 && (lo != hi || i == seq.len() - 1);
            if cached && let Some(&id) = self.suffixes.get(&(lo, hi, next)) {
                next = id;
                continue;
            }
            self.instructions += 1;
            let id = self.instructions;
            if cached {
                self.suffixes.insert((lo, hi, next), id);
            }
            next = id;
        }
    }
}

/// The UTF-8 bytes of a code point, surrogates included (RE2 encodes them too).
fn utf8(c: u32) -> Vec<u8> {
    match c {
        0..=0x7F => vec![c as u8],
        0x80..=0x7FF => vec![0xC0 | (c >> 6) as u8, 0x80 | (c & 0x3F) as u8],
        0x800..=0xFFFF => vec![
            0xE0 | (c >> 12) as u8,
            0x80 | ((c >> 6) & 0x3F) as u8,
            0x80 | (c & 0x3F) as u8,
        ],
        _ => vec![
            0xF0 | (c >> 18) as u8,
            0x80 | ((c >> 12) & 0x3F) as u8,
            0x80 | ((c >> 6) & 0x3F) as u8,
            0x80 | (c & 0x3F) as u8,
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn estimate(re: &str) -> u64 {
        let mut tree = ast::parse::Parser::new().parse(re).unwrap();
        asciify_perl_classes(&mut tree);
        let hir = hir::translate::Translator::new()
            .translate(re, &tree)
            .unwrap();
        program_size(&hir)
    }

    #[test]
    fn repeat_counts_stop_at_re2s_limit() {
        // The finding: istiod (Go's regexp, RE2's rules) refuses a{1001}.
        let e = validate_re2("a{1001}").unwrap_err();
        assert!(e.contains("invalid repetition size: {1001}"), "{e}");
        assert!(e.contains("RE2"), "{e}");
        assert!(validate_re2("a{1000}").is_ok());
        assert!(validate_re2("a{2,1000}").is_ok());
        assert!(validate_re2("a{2,1001}").is_err());
        assert!(validate_re2("a{1001,}").is_err());
        assert!(validate_re2("a{1000,}").is_ok());
    }

    #[test]
    fn nested_repeats_divide_re2s_budget() {
        // 1000 / 100 / 10 = 1: allowed; 1000 / 101 / 10 = 0: RE2 says "bad repetition".
        assert!(validate_re2("(a{10}){100}").is_ok());
        let e = validate_re2("(a{10}){101}").unwrap_err();
        assert!(e.contains("invalid repetition size: {101} (nested"), "{e}");
        assert!(validate_re2("((a{2}){2}){250}").is_ok());
        assert!(validate_re2("((a{2}){2}){251}").is_err());
        // Unbounded repeats count their minimum; `*`, `+` and `?` are not counted.
        assert!(validate_re2("(a{2,}){501}").is_err());
        assert!(validate_re2("((a*)+){1000}").is_ok());
        // Sibling repeats do not multiply.
        assert!(validate_re2("a{1000}b{1000}").is_ok());
    }

    #[test]
    fn syntax_re2_lacks_is_refused() {
        // Each checked against RE2 (google-re2 1.1): RE2 refuses all of these.
        for bad in [
            "foo(?=bar)",     // look-ahead: "invalid perl operator"
            "(a)\\1",         // back-reference: "invalid escape sequence"
            "a*+",            // possessive: "bad repetition operator"
            "a**",            // ditto
            "a{2}{3}",        // ditto
            "(?x)a b",        // verbose flag: "invalid perl operator"
            "(?R)a$",         // CRLF flag: ditto
            "\\u0041",        // \u escape: "invalid escape sequence"
            "\\p{Greek=Yes}", // property values: "invalid character class range"
            "\\p{greek}",     // RE2's script names are case sensitive: ditto
            "\\p{Emoji}",     // not a category or a script: ditto
            "\\p{Grek}",      // a script code, not its name: ditto
        ] {
            assert!(validate_re2(bad).is_err(), "{bad} should be refused");
        }
        // RE2 takes these as literal text where regex-syntax (and presumably the
        // author) means something else; refused as ambiguous. `\C` is RE2's any byte,
        // which Go's regexp (istiod) refuses.
        for ambiguous in [
            "\\<word\\>",
            "\\b{start}a",
            "[a-z&&[^aeiou]]",
            "[[a-z]]",
            "a{ 2 }",
            "\\C",
        ] {
            assert!(
                validate_re2(ambiguous).is_err(),
                "{ambiguous} should be refused"
            );
        }
        for good in [
            "^/api/v[0-9]+$",
            "(?i)^/Foo/(?P<id>\\d+)$",
            "(?<id>[a-z]+)",
            "\\pL\\p{Greek}\\p{Lu}\\PN\\p{Old_Italic}\\p{Thai}\\p{Han}\\p{Any}",
            "[[:alpha:]_-]+",
            "\\x41\\x{263a}\\t\\n",
            "\\Aa\\z|\\bb\\B",
            "(?sU)a.*b",
            "a{,", // regex-syntax errors too: refused, fine either way
        ]
        .into_iter()
        .filter(|g| !g.ends_with(','))
        {
            assert!(
                validate_re2(good).is_ok(),
                "{good}: {:?}",
                validate_re2(good)
            );
        }
    }

    /// `RE2::ProgramSize()` of each pattern, from RE2 itself (google-re2 1.1, the
    /// Python binding of RE2 2025-11, `re2.compile(p).programsize`).
    const RE2_SIZES: &[(&str, u64)] = &[
        ("a", 5),
        ("abc", 7),
        ("a{1000}", 1004),
        ("a{0,2}", 8),
        ("\\w", 7),
        ("\\d+", 6),
        (".", 12),
        ("[^/]", 12),
        ("[^/]{1000}", 8004),
        ("[a-z0-9]{1000}", 2004),
        ("(?i)abc", 7),
        ("(abc|def|ghi|jkl|mno|pqr|stu|vwx){1000}", 26004),
        ("\\W{100}", 1104),
        ("[\\x{80}-\\x{10FFFF}]", 10),
        (".{1000}.{1000}", 16004),
        ("(a)", 7),
        ("(?:abc|def|ghi){2}", 22),
    ];

    /// Patterns RE2 sizes smaller than the estimate (it strips a `^literal` prefix
    /// and anchors, and factors alternations).
    const RE2_SMALLER: &[(&str, u64)] = &[
        (
            "^/user/(488/sms|h5/getJwt|captcha|version/getAIDrawTemplate|version/isMainLand|version/promotionTemplate|version/activityTemplate2).*",
            106,
        ),
        ("^/api/v[0-9]+/users/[a-z]+$", 15),
        ("\\pL", 1200),
        ("\\p{Greek}+", 67),
        ("(a|b|c)*", 7),
        ("^(?:[a-zA-Z0-9-]+\\.)*example\\.com$", 19),
    ];

    #[test]
    fn program_size_matches_re2_or_counts_more() {
        for &(re, want) in RE2_SIZES {
            assert_eq!(estimate(re), want, "{re}");
        }
        for &(re, re2) in RE2_SMALLER {
            let n = estimate(re);
            assert!(n >= re2 && n <= 2 * re2, "{re}: {n} vs RE2's {re2}");
        }
    }

    #[test]
    fn program_size_limit_is_envoys_as_istio_runs_it() {
        // RE2: 32764, then 32772 instructions.
        let fits = format!("{}[^/]{{95}}", "[^/]{1000}".repeat(4));
        assert!(validate_re2(&fits).is_ok(), "{:?}", validate_re2(&fits));
        let over = format!("{}[^/]{{96}}", "[^/]{1000}".repeat(4));
        let e = validate_re2(&over).unwrap_err();
        assert!(
            e.contains("program size of about 32772 > max program size of 32768"),
            "{e}"
        );
        // RE2: 38004 (12 three-byte branches and a capture, a thousand times).
        assert!(validate_re2("(abc|def|ghi|jkl|mno|pqr|stu|vwx|yza|bcd|efg|hij){1000}").is_err());
        // RE2: 30004.
        assert!(validate_re2(&format!("(?:{}){{1000}}", "a".repeat(30))).is_ok());
    }

    #[test]
    fn length_and_emptiness_as_istio() {
        assert!(validate_re2("").is_err());
        let long = "a".repeat(MAX_PATTERN_LEN + 1);
        assert!(
            validate_re2(&long)
                .unwrap_err()
                .contains("max length allowed is 1024")
        );
        assert!(validate_re2(&"a".repeat(MAX_PATTERN_LEN)).is_ok());
    }
}
