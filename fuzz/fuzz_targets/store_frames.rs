#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cannon_fuzz::store_frames(data));
