package seccomp

import (
	"golang.org/x/sys/unix"
)

// SignalGuard returns a filter that refuses (EPERM) every signal to a
// process or thread id below fence, except SIGURG (which the Go runtime
// of the agent sends its own threads to preempt goroutines; its default
// action is to ignore it) and signal 0 (an existence check), and pidfd_open
// of such an id. It protects an agent that is PID 1 of a kernel that does
// not shield a namespace's init from signals sent from inside (gVisor):
// the agent's threads hold the ids below fence, every command gets a
// higher one. Other syscalls are allowed: this filter is the only one
// such a sandbox runs under, next to its kernel's own checks.
func SignalGuard(fence uint32) ([]unix.SockFilter, error) {
	t, ok := nativeTable()
	if !ok {
		return nil, ErrUnsupported
	}
	var a assembler
	a.ld(offArch)
	a.jeq(t.auditArch, "", "allow")
	a.ld(offNr)
	for _, nr := range t.signalSig1 {
		a.jeq(nr, "sig1", "")
	}
	for _, nr := range t.signalSig2 {
		a.jeq(nr, "sig2", "")
	}
	a.jeq(t.pidfdOpen, "pidfd", "")
	a.ret(retAllow)

	// kill, tkill, rt_sigqueueinfo: (id, sig, ...); tgkill,
	// rt_tgsigqueueinfo: (tgid, tid, sig, ...).
	for _, c := range []struct {
		label  string
		sigOff uint32
	}{{"sig1", offArg1Low}, {"sig2", offArg2Low}} {
		a.label(c.label)
		a.ld(offArg0Low)
		a.jeq(0, "allow", "")
		a.jge(fence, "allow", "")
		a.ld(c.sigOff)
		a.jeq(0, "allow", "")
		a.jeq(uint32(unix.SIGURG), "allow", "eperm")
	}

	a.label("pidfd")
	a.ld(offArg0Low)
	a.jeq(0, "allow", "")
	a.jge(fence, "allow", "eperm")

	a.label("eperm")
	a.ret(retEPERM)
	a.label("allow")
	a.ret(retAllow)
	return a.assemble()
}
