//! One module per command (or group of commands): its arguments and a
//! short `run` that calls the library and formats the answer.

pub mod archive;
pub mod cost;
pub mod edit;
pub mod fsck;
pub mod gc;
pub mod generate;
pub mod info;
pub mod init;
pub mod meta;
pub mod mount;
pub mod sim;
pub mod snapshot;
pub mod stats;
pub mod status;
pub mod tape;
pub mod tier;
pub mod top;
pub mod umount;
