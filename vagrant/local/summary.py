#!/usr/bin/env python3
"""Counts of a GoogleTest XML report (passed, failed, skipped per suite
binary), one line each plus a total: what vagrant/run-local.sh prints."""
import sys
import xml.etree.ElementTree as ET

total = {"passed": 0, "failed": 0, "skipped": 0}
for path in sys.argv[1:]:
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failed = []
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.find("failure") is not None:
            counts["failed"] += 1
            failed.append(case.get("classname") + "." + case.get("name"))
        elif case.get("result") == "skipped" or case.find("skipped") is not None:
            counts["skipped"] += 1
        elif case.get("status", "run") == "run":
            counts["passed"] += 1
    name = path.rsplit("/", 1)[-1].removesuffix(".xml")
    print(f"{name}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    for f in failed:
        print(f"  FAILED {f}")
    for k in total:
        total[k] += counts[k]
print(f"total: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
