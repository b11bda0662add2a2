// Package version says which build of SPACE is running: the release
// version and the git commit it was built from.
package version

import "runtime/debug"

// Version is the release version; scripts may override it with
// -ldflags "-X github.com/space-sandbox/space/internal/version.Version=…".
var Version = "0.1.0"

// Commit, when set with -ldflags "-X …/internal/version.Commit=…", names
// the commit; otherwise it comes from the build's VCS stamp (go build in a
// git checkout records vcs.revision and vcs.modified).
var Commit = ""

// Info is what `space version --json` and GET /v1/info report.
type Info struct {
	Version string `json:"version"`
	// Commit is the git revision, with "-dirty" when the tree had local
	// changes; "" when the build carries none (go build -buildvcs=false).
	Commit string `json:"commit,omitempty"`
	// CommitTime is the commit's time (RFC 3339), when known.
	CommitTime string `json:"commit_time,omitempty"`
}

// Get returns this binary's version and commit.
func Get() Info {
	in := Info{Version: Version, Commit: Commit}
	if in.Commit != "" {
		return in
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return in
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Commit = s.Value
		case "vcs.time":
			in.CommitTime = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && in.Commit != "" {
		in.Commit += "-dirty"
	}
	return in
}

// String is "0.1.0 (commit abc123…)" or just the version.
func (i Info) String() string {
	if i.Commit == "" {
		return i.Version
	}
	return i.Version + " (commit " + i.Commit + ")"
}
