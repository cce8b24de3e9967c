//! Unit tests of the matchers, the translation and the TCP semantics.
