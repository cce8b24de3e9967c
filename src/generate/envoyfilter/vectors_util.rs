//! `util_test.go` (see `super::vectors`): `TestReplaceAndInsert`, Istio's list helpers
//! (replace, insert before, insert after the first element a patch names) checked on
//! the engine's one list operation ([`super::listener::list_op`]). Each case finds the
//! first `1` and replaces it with `10` or inserts `10` before or after it.

use meshfed_api::networking::v1alpha3::envoy_filter::patch::Operation;

use super::listener::list_op;

const FILE: &str = "util_test.go";

type Outcome = (&'static str, String, Result<(), String>);

/// (name, input, replaced, inserted before, inserted after, applied).
type Case = (
    &'static str,
    &'static [i32],
    &'static [i32],
    &'static [i32],
    &'static [i32],
    bool,
);

const CASES: &[Case] = &[
    ("nil slice", &[], &[], &[], &[], false),
    (
        "the first",
        &[1, 2, 3],
        &[10, 2, 3],
        &[10, 1, 2, 3],
        &[1, 10, 2, 3],
        true,
    ),
    (
        "the middle",
        &[0, 1, 2, 3],
        &[0, 10, 2, 3],
        &[0, 10, 1, 2, 3],
        &[0, 1, 10, 2, 3],
        true,
    ),
    (
        "the last",
        &[3, 2, 1],
        &[3, 2, 10],
        &[3, 2, 10, 1],
        &[3, 2, 1, 10],
        true,
    ),
    (
        "match multiple",
        &[1, 2, 1],
        &[10, 2, 1],
        &[10, 1, 2, 1],
        &[1, 10, 2, 1],
        true,
    ),
    ("not exists", &[2, 3], &[2, 3], &[2, 3], &[2, 3], false),
];

fn case(c: &Case) -> Result<(), String> {
    let (_, input, replaced, before, after, applied) = *c;
    let mut wrong = Vec::new();
    for (op, want) in [
        (Operation::Replace, replaced),
        (Operation::InsertBefore, before),
        (Operation::InsertAfter, after),
    ] {
        let mut list = input.to_vec();
        let got = list_op(&mut list, op, Some(10), true, |e| *e == 1, true);
        if list != want || got != applied {
            wrong.push(format!(
                "{op:?}: got {list:?} (applied {got}), want {want:?} (applied {applied})"
            ));
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

pub(super) fn all() -> Vec<Outcome> {
    CASES
        .iter()
        .map(|c| (FILE, format!("TestReplaceAndInsert/{}", c.0), case(c)))
        .collect()
}
