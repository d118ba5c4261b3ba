"""Reads a run's TensorBoard event files with Google's protobuf runtime (the message classes protoc
generates from tensorboard_event.proto) and checks each record's framing with crcmod's CRC-32C:
every file starts with file_version "brain.Event:2" and a SessionLog START at the step its run
started from; every metrics.jsonl record's numbers are scalars at its step, as float32.

Usage: tensorboard_reference.py GENERATED_DIR RUN_DIR EXPECTED_STARTS
  GENERATED_DIR: where `protoc --python_out` wrote tensorboard_event_pb2.py
  EXPECTED_STARTS: the START steps of the files in time order, comma-separated (e.g. "1,5")
"""
import json
import os
import struct
import sys
import time

import crcmod.predefined

sys.path.insert(0, sys.argv[1])
import tensorboard_event_pb2  # noqa: E402

crc32c = crcmod.predefined.mkCrcFun("crc-32c")


def masked(data):
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    data = open(path, "rb").read()
    at = 0
    while at < len(data):
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        assert length_crc == masked(header), f"{path}: bad length checksum at byte {at}"
        body = data[at + 12:at + 12 + length]
        (body_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        assert body_crc == masked(body), f"{path}: bad data checksum at byte {at}"
        event = tensorboard_event_pb2.Event()
        event.ParseFromString(body)
        yield event
        at += 16 + length


def as_float32(value):
    return struct.unpack("<f", struct.pack("<f", value))[0]


def main():
    run_dir, expected_starts = sys.argv[2], [int(s) for s in sys.argv[3].split(",")]
    directory = os.path.join(run_dir, "tensorboard")
    files = sorted(os.listdir(directory), key=lambda name: os.path.getmtime(os.path.join(directory, name)))
    assert all(name.startswith("events.out.tfevents.") for name in files), files
    assert len(files) == len(expected_starts), f"{len(files)} event files, expected {len(expected_starts)}"
    scalars = {}  # step -> {tag: value}, later files replacing earlier ones from their start on
    for name, start in zip(files, expected_starts):
        events = list(records(os.path.join(directory, name)))
        assert events[0].WhichOneof("what") == "file_version" and events[0].file_version == "brain.Event:2", events[0]
        assert events[1].WhichOneof("what") == "session_log", events[1]
        assert events[1].session_log.status == tensorboard_event_pb2.SessionLog.START, events[1]
        assert events[1].step == start, f"{name}: START at step {events[1].step}, expected {start}"
        scalars = {step: values for step, values in scalars.items() if step < start}  # TensorBoard's purge
        for event in events[2:]:
            assert event.WhichOneof("what") == "summary", event
            assert abs(event.wall_time - time.time()) < 3600, event.wall_time
            scalars[event.step] = {value.tag: value.simple_value for value in event.summary.value}
    metrics = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert sorted(scalars) == [record["step"] for record in metrics], (sorted(scalars), len(metrics))
    for record in metrics:
        expected = {key: as_float32(value) for key, value in record.items()
                    if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)}
        assert scalars[record["step"]] == expected, (record["step"], scalars[record["step"]], expected)
    print(f"{len(files)} event files, {len(scalars)} steps of {len(expected)} scalars match metrics.jsonl")


main()
