#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nvwc_fuzz::nbd::check_starttls(data));
