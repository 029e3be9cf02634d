//! The crate's integration tests, one module per concern, linked as one binary
//! (a binary per file would link the whole dependency tree once per file).

mod crash;
mod disk;
mod disk_folder;
mod disk_full;
mod keep_slots;
mod persist;
mod pool;
mod shift;
mod sliding;
mod sliding_release;
mod views;
mod views_model;
mod window;
