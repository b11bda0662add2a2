package agent

// Hooks for the external tests in package agent_test.

// WithEtcDir makes the server read passwd and group from dir.
func WithEtcDir(o Options, dir string) Options {
	o.etcDir = dir
	return o
}

// WithMaxListEntries lowers the directory listing cap.
func WithMaxListEntries(o Options, n int) Options {
	o.maxListEntries = n
	return o
}

// ReapsAll reports whether the shared reaper reaps every child (production
// PID 1 mode) in this test run.
func ReapsAll() bool {
	r := sharedReaper()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.allRefs > 0
}

// ReaperModeEnv names the variable that selects the reaper mode of a run.
const ReaperModeEnv = reaperModeEnv

// WithProcDir makes the port listing read net/tcp{,6} under dir.
func WithProcDir(o Options, dir string) Options {
	o.procDirOverride = dir
	return o
}

// ReserveThreads is reserveThreads.
func ReserveThreads(n int) { reserveThreads(n) }
