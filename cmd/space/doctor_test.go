package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/doctor"
)

// TestDoctorBinary runs the real `space doctor`, as JSON and for people.
func TestDoctorBinary(t *testing.T) {
	bin := buildCLI(t)
	out, err := exec.Command(bin, "doctor", "--json", "--data-dir", t.TempDir()).Output()
	if err != nil {
		t.Fatalf("space doctor --json: %v", err)
	}
	var rep doctor.Report
	dec := json.NewDecoder(strings.NewReader(string(out)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("not a doctor report: %v\n%s", err, out)
	}
	if len(rep.Checks) != len(doctor.CheckNames) {
		t.Errorf("%d checks, want %d", len(rep.Checks), len(doctor.CheckNames))
	}
	if rep.Driver.Reason == "" {
		t.Errorf("no reason for the driver choice: %+v", rep.Driver)
	}
	switch {
	case os.Geteuid() == 0 && rep.Driver.Auto == "":
		t.Errorf("as root some driver works (namespace at least): %+v", rep.Driver)
	case os.Geteuid() != 0 && rep.Driver.Auto == "" && rep.Driver.Error == "":
		t.Errorf("no driver and no error: %+v", rep.Driver)
	}
	t.Logf("auto: %s (%s)", rep.Driver.Auto, rep.Driver.Reason)

	human, err := exec.Command(bin, "doctor").CombinedOutput()
	if err != nil {
		t.Fatalf("space doctor: %v\n%s", err, human)
	}
	for _, want := range append([]string{"CHECK", "driver auto: " + rep.Driver.Auto, "why: "}, doctor.CheckNames...) {
		if !strings.Contains(string(human), want) {
			t.Errorf("human output lacks %q:\n%s", want, human)
		}
	}
	err = exec.Command(bin, "doctor", "extra").Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitUsage {
		t.Errorf("space doctor extra: %v, want exit %d", err, exitUsage)
	}
}
