"""An audit as a JUnit XML report, the test-report format CI systems show (Jenkins, GitLab,
GitHub Actions reporters, Buildkite).

Pure: audit results in, XML bytes out. One <testsuite> per artifact and one <testcase> per check:
a FAIL is a <failure>, a skipped check is <skipped>, a warning passes with its message in
<system-out> (JUnit has no warning).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence

from efabuild.provenance.checks import FAIL, SKIP, WARN

# characters XML 1.0 cannot hold, even escaped (a message quoting a binary's bytes)
# (and surrogates: a name read from an image that is not UTF-8)
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def to_junit(results: Sequence) -> bytes:
    suites = ET.Element("testsuites", name="efabuild audit")
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    for result in results:
        label = _text(f"{result.name} {result.key[:12]}".strip() or result.ref)
        counts = {"tests": len(result.checks), "failures": sum(c.status == FAIL for c in result.checks),
                  "skipped": sum(c.status == SKIP for c in result.checks)}
        suite = ET.SubElement(suites, "testsuite", name=label, errors="0",
                              **{name: str(value) for name, value in counts.items()})
        properties = ET.SubElement(suite, "properties")
        for name, value in (("ref", result.ref), ("key", result.key), ("name", result.name)):
            ET.SubElement(properties, "property", name=name, value=_text(value or ""))
        for check in result.checks:
            case = ET.SubElement(suite, "testcase", name=_text(check.name), classname=f"efabuild.audit.{label}")
            message = _text(check.message)
            if check.status == FAIL:
                ET.SubElement(case, "failure", message=message, type="audit").text = message
            elif check.status == SKIP:
                ET.SubElement(case, "skipped", message=message)
            elif check.status == WARN:
                ET.SubElement(case, "system-out").text = f"warning: {message}"
        for name in totals:
            totals[name] += counts[name]
    for name, value in totals.items():
        suites.set(name, str(value))
    suites.set("errors", "0")
    ET.indent(suites)
    return ET.tostring(suites, encoding="utf-8", xml_declaration=True) + b"\n"


def _text(value: str) -> str:
    return _NOT_XML.sub("\ufffd", value)
