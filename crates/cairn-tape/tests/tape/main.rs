//! Integration tests of cairn-tape: each area is a module.
#![allow(clippy::field_reassign_with_default)] // tests tweak a few parameters of a default

mod common;
mod emu_conformance;
mod emu_crash;
mod emu_model;
mod emu_timing;
mod layout;
mod reclaim;
mod st_conformance;
mod store;
