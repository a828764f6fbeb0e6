//! The emulator's timing model against numbers computed by hand.

use cairn_tape::{Clock, EmuDrive, EmuParams, TapeDevice, VirtualClock};

use crate::common::emu;

const BS: usize = 4096;

/// A slow drive whose numbers are easy to follow: 1 block = 0.1 m of tape
/// on one wrap of 1,000 m; locates cost 3 s + distance at 10 m/s.
fn geometry() -> EmuParams {
    let mut p = EmuParams::default();
    p.block_size = BS as u32;
    p.capacity_bytes = BS as u64 * 10 * 1000;
    p.early_warning_bytes = BS as u64 * 100;
    p.tape_length_m = 1000.0;
    p.wraps = 1;
    p.locate_fixed_secs = 3.0;
    p.locate_speed_mps = 10.0;
    p
}

fn write_n(d: &mut EmuDrive, n: usize) {
    d.write_blocks(&vec![0x5a; n * BS]).unwrap();
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

#[test]
fn locate_time_grows_with_distance() {
    let t = tempfile::tempdir().unwrap();
    let (mut d, vc) = emu(&t.path().join("tape"), geometry());
    write_n(&mut d, 2000);
    d.flush().unwrap();
    d.reset_stats();
    // 2000 → 1000 blocks: 100 m → 3 + 100/10 = 13 s.
    let t0 = vc.now();
    d.locate(1000).unwrap();
    assert!(
        close(vc.now() - t0, 13.0, 1e-6),
        "locate over 100 m took {}",
        vc.now() - t0
    );
    // 1000 → 1500: 50 m → 8 s.
    let t0 = vc.now();
    d.locate(1500).unwrap();
    assert!(
        close(vc.now() - t0, 8.0, 1e-6),
        "locate over 50 m took {}",
        vc.now() - t0
    );
    // Already there and stopped: free.
    let t0 = vc.now();
    d.locate(1500).unwrap();
    assert!(close(vc.now() - t0, 0.0, 1e-9));
    // Rewind from 1500: 150 m → 18 s.
    let t0 = vc.now();
    d.rewind().unwrap();
    assert!(
        close(vc.now() - t0, 18.0, 1e-6),
        "rewind over 150 m took {}",
        vc.now() - t0
    );
    let s = d.stats();
    assert!(close(s.metres, 300.0, 1e-6), "metres moved: {}", s.metres);
    assert_eq!(s.locates, 3);
    assert!(close(s.positioning_secs, 39.0, 1e-6));
}

#[test]
fn serpentine_locate_measures_longitudinal_distance() {
    // Two wraps: block 0 and the last block of the tape sit at the same end.
    let t = tempfile::tempdir().unwrap();
    let mut p = geometry();
    p.capacity_bytes = BS as u64 * 2000; // 1000 blocks per wrap
    p.early_warning_bytes = BS as u64 * 10;
    p.wraps = 2;
    let (mut d, vc) = emu(&t.path().join("tape"), p);
    write_n(&mut d, 1990);
    d.flush().unwrap();
    // The head is at block 1990: wrap 1, 990/1000 of the way back = 10 m from BOT.
    let t0 = vc.now();
    d.rewind().unwrap();
    assert!(
        close(vc.now() - t0, 3.0 + 10.0 / 10.0, 1e-6),
        "rewind from near BOT on the return wrap: {}",
        vc.now() - t0
    );
    // Block 1000 starts wrap 1 at the far end (1000 m); block 500 is at 500 m.
    d.locate(500).unwrap();
    let t0 = vc.now();
    d.locate(1000).unwrap();
    assert!(
        close(vc.now() - t0, 3.0 + 500.0 / 10.0, 1e-6),
        "{}",
        vc.now() - t0
    );
}

/// Speed-matching parameters scaled to small numbers: native 1 MB/s, the
/// slowest speed 354 kB/s (LTO-9's 177/400... ratio is 0.4425; 0.354 here),
/// a 256 KiB buffer that starts the tape at a quarter full.
fn streaming() -> EmuParams {
    let mut p = EmuParams::default();
    p.block_size = BS as u32;
    p.native_rate = 1e6;
    p.min_rate = 354e3;
    p.buffer_bytes = 256 * 1024;
    p.start_threshold = 0.25;
    p.target_level = 0.5;
    p.control_secs = 5.0;
    p.rate_window_secs = 2.0;
    p.backhitch_secs = 0.5;
    p
}

/// Feeds `secs` of data at `rate` in writes of `chunk` bytes, spending host
/// time between them.
fn feed(d: &mut EmuDrive, vc: &VirtualClock, rate: f64, secs: f64, chunk: usize) -> u64 {
    let mut sent = 0u64;
    let start = vc.now();
    while vc.now() - start < secs {
        d.write_blocks(&vec![1u8; chunk]).unwrap();
        sent += chunk as u64;
        vc.advance(chunk as f64 / rate);
    }
    sent
}

#[test]
fn host_within_speed_matching_range_never_backhitches() {
    for rate in [400e3, 600e3, 900e3] {
        let t = tempfile::tempdir().unwrap();
        let (mut d, vc) = emu(&t.path().join("tape"), streaming());
        let sent = feed(&mut d, &vc, rate, 60.0, 4 * BS);
        let s = d.stats();
        assert_eq!(
            s.backhitches, 0,
            "host at {rate} B/s (range 354k..1M) caused backhitches"
        );
        // The tape streamed all along, at the host's rate, after the start-up fill.
        let fill = 65536.0 / rate;
        assert!(
            s.streaming_secs > 60.0 - fill - 2.0,
            "streamed {} s of 60 at {rate}",
            s.streaming_secs
        );
        assert!(close(s.bytes_written as f64, sent as f64, 1.0));
    }
}

#[test]
fn host_below_minimum_rate_backhitches_as_computed() {
    let t = tempfile::tempdir().unwrap();
    let p = streaming();
    let (mut d, vc) = emu(&t.path().join("tape"), p.clone());
    let h = 200e3;
    // One block per write, so that the continuous reckoning below holds
    // (coarser writes empty the buffer up to one write earlier per cycle).
    feed(&mut d, &vc, h, 60.0, BS);
    let s = d.stats();
    // By hand: the tape starts when the buffer holds T = 64 KiB, runs at the
    // minimum speed (the host is slower) until the buffer is dry, stops,
    // and after the next T backhitches for P seconds (the host keeps
    // filling meanwhile) and runs dry again.
    let (tt, pp, min) = (65536.0, p.backhitch_secs, p.min_rate);
    let first = tt / h + tt / (min - h);
    let cycle = tt / h + pp + (tt + h * pp) / (min - h);
    let expected = ((60.0 - first) / cycle).floor();
    assert!(
        (s.backhitches as f64 - expected).abs() <= 2.0,
        "{} backhitches, {expected} expected (cycle {cycle:.3} s)",
        s.backhitches
    );
    assert!(
        close(s.positioning_secs, s.backhitches as f64 * pp, 1.0),
        "backhitch time {}",
        s.positioning_secs
    );
}

#[test]
fn fast_host_is_held_to_the_native_rate() {
    let t = tempfile::tempdir().unwrap();
    let p = streaming();
    let (mut d, vc) = emu(&t.path().join("tape"), p.clone());
    // The host never spends time: the drive sets the pace.
    let n = 2_000_000 / BS;
    let t0 = vc.now();
    for _ in 0..n / 16 {
        write_n(&mut d, 16);
    }
    d.flush().unwrap();
    let secs = vc.now() - t0;
    let bytes = (n / 16 * 16 * BS) as f64;
    assert!(
        close(secs, bytes / p.native_rate, 1e-3),
        "{bytes} bytes in {secs} s at 1 MB/s"
    );
    assert_eq!(d.stats().backhitches, 0);
}

#[test]
fn a_flush_stops_the_tape_and_the_next_write_backhitches() {
    let t = tempfile::tempdir().unwrap();
    let p = streaming();
    let (mut d, _vc) = emu(&t.path().join("tape"), p);
    write_n(&mut d, 64);
    d.flush().unwrap();
    assert_eq!(
        d.stats().backhitches,
        0,
        "the first start after a locate is not a backhitch"
    );
    write_n(&mut d, 64);
    d.flush().unwrap();
    write_n(&mut d, 64);
    d.flush().unwrap();
    assert_eq!(
        d.stats().backhitches,
        2,
        "every write after a flush backhitches"
    );
}

#[test]
fn reading_streams_at_native_rate_and_a_slow_reader_backhitches() {
    let t = tempfile::tempdir().unwrap();
    let p = streaming();
    let (mut d, vc) = emu(&t.path().join("tape"), p.clone());
    let n = 1000;
    write_n(&mut d, n);
    d.flush().unwrap();
    d.rewind().unwrap();
    d.reset_stats();
    let mut buf = vec![0u8; 16 * BS];
    let t0 = vc.now();
    let mut got = 0;
    while got < n {
        match d.read_blocks(&mut buf).unwrap() {
            cairn_tape::ReadOutcome::Blocks(k) => got += k,
            other => panic!("{other:?}"),
        }
    }
    let secs = vc.now() - t0;
    assert!(
        close(secs, (n * BS) as f64 / p.native_rate, 1e-3),
        "read {n} blocks in {secs} s"
    );
    assert_eq!(d.stats().backhitches, 0);
    // A reader slower than the minimum speed: the buffer fills, the tape stops.
    d.rewind().unwrap();
    d.reset_stats();
    let mut got = 0;
    while got < n {
        if let cairn_tape::ReadOutcome::Blocks(k) = d.read_blocks(&mut buf[..4 * BS]).unwrap() {
            got += k;
            vc.advance((k * BS) as f64 / 100e3);
        }
    }
    assert!(
        d.stats().backhitches > 0,
        "a reader at 100 kB/s (minimum 354 kB/s) caused no backhitch"
    );
}

#[test]
fn load_and_unload_take_their_time() {
    let t = tempfile::tempdir().unwrap();
    let p = geometry();
    let (mut d, vc) = emu(&t.path().join("tape"), p.clone());
    write_n(&mut d, 1000); // 100 m
    d.flush().unwrap();
    let t0 = vc.now();
    d.unload().unwrap();
    assert!(
        close(vc.now() - t0, 3.0 + 10.0 + p.unload_secs, 1e-6),
        "unload: {}",
        vc.now() - t0
    );
    assert!(matches!(
        d.position(),
        Err(cairn_tape::DeviceError::NoTape { .. })
    ));
    assert!(d.status().unwrap().no_tape);
    let t0 = vc.now();
    d.load().unwrap();
    assert!(close(vc.now() - t0, p.load_secs, 1e-6));
    assert_eq!(d.position().unwrap(), 0);
}

#[test]
fn real_clock_makes_throughput_real() {
    let t = tempfile::tempdir().unwrap();
    let mut p = streaming();
    p.native_rate = 20e6;
    p.min_rate = 8e6;
    p.buffer_bytes = 1 << 20;
    let mut d = EmuDrive::create(&t.path().join("tape"), p, Clock::real()).unwrap();
    let start = std::time::Instant::now();
    for _ in 0..40 {
        write_n(&mut d, 25); // 40 × 100 KiB = 4 MiB
    }
    d.flush().unwrap();
    let secs = start.elapsed().as_secs_f64();
    let model = 40.0 * 25.0 * BS as f64 / 20e6;
    assert!(
        secs >= model * 0.95,
        "4 MiB at 20 MB/s took only {secs} s (model {model} s)"
    );
}

/// Closing the drive records its session (a mount's drive is inside the
/// mount's process; benchmarks and `cairn tape info` read it afterwards).
#[test]
fn a_closed_drive_leaves_its_sessions_statistics() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let (mut d, vc) = emu(&dir, geometry());
    write_n(&mut d, 2000);
    d.flush().unwrap();
    d.locate(1000).unwrap();
    let expect = d.stats();
    let t_close = vc.now();
    drop(d);
    let s = cairn_tape::Session::read(&dir).expect("a session file");
    assert_eq!(s.stats.bytes_written, expect.bytes_written);
    assert_eq!(s.stats.locates, expect.locates);
    assert!(s.stats.bytes_written >= 2000 * BS as u64);
    assert!(s.seconds >= t_close - 1e-6 && t_close > 10.0, "{} vs {t_close}", s.seconds);
}
