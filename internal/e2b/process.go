package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/agent/client"
	"github.com/space-sandbox/space/internal/core"
	pb "github.com/space-sandbox/space/internal/e2b/gen/process"
	"github.com/space-sandbox/space/internal/e2b/gen/process/processpbconnect"
	"github.com/space-sandbox/space/internal/execlog"
	"github.com/space-sandbox/space/internal/node"
)

// processService maps envd's process service onto SPACE commands: Start is
// node.Sandbox.Exec, and every output stream (Start, Connect) reads the
// command's host-side log, so a dropped stream loses nothing and does not
// stop the command.
type processService struct {
	processpbconnect.UnimplementedProcessHandler
	e *Envd
}

// rpcError maps agent and core errors to Connect codes the SDK understands.
func rpcError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	var ae *client.Error
	if errors.As(err, &ae) {
		msg := ae.Message
		switch {
		case ae.Code == agent.CodeAlreadyExists:
			return connect.NewError(connect.CodeAlreadyExists, errors.New(msg))
		case ae.Status == 404:
			return connect.NewError(connect.CodeNotFound, errors.New(msg))
		case ae.Status == 400 || ae.Status == 413:
			return connect.NewError(connect.CodeInvalidArgument, errors.New(msg))
		case ae.Status == 403:
			return connect.NewError(connect.CodePermissionDenied, errors.New(msg))
		case ae.Status == 409:
			return connect.NewError(connect.CodeFailedPrecondition, errors.New(msg))
		case ae.Status == 429 || ae.Status == 507:
			return connect.NewError(connect.CodeResourceExhausted, errors.New(msg))
		}
		return connect.NewError(connect.CodeInternal, errors.New("the sandbox agent failed"))
	}
	switch {
	case errors.Is(err, core.ErrNotFound):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, core.ErrInvalid):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.Is(err, core.ErrExhausted):
		return connect.NewError(connect.CodeResourceExhausted, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeCanceled, err)
	}
	return connect.NewError(connect.CodeInternal, errors.New("internal error"))
}

func invalidArg(format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, args...))
}

// find returns the command a selector names. PIDs can be reused inside the
// sandbox, so a running command wins over a finished one, then the newest.
func find(sb *node.Sandbox, sel *pb.ProcessSelector) (*node.Command, error) {
	if sel == nil || sel.Selector == nil {
		return nil, invalidArg("process selector (pid or tag) is required")
	}
	var best *node.Command
	for _, c := range sb.Commands() {
		match := false
		switch s := sel.Selector.(type) {
		case *pb.ProcessSelector_Pid:
			match = uint32(c.Info.PID) == s.Pid
		case *pb.ProcessSelector_Tag:
			match = s.Tag != "" && c.Info.Tag == s.Tag
		}
		if !match {
			continue
		}
		if best == nil || c.Exit() == nil || best.Exit() != nil {
			best = c
		}
	}
	if best == nil {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("process not found"))
	}
	return best, nil
}

func (s *processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	c := callOf(ctx)
	m := req.Msg
	cfg := m.GetProcess()
	if cfg == nil || cfg.Cmd == "" {
		return invalidArg("process.cmd is required")
	}
	if len(cfg.Args) > agent.MaxArgs {
		return invalidArg("more than %d arguments", agent.MaxArgs)
	}
	total := len(cfg.Cmd)
	for _, a := range cfg.Args {
		total += len(a)
	}
	for k, v := range cfg.Envs {
		total += len(k) + len(v)
	}
	if total > agent.MaxArgBytes {
		return invalidArg("cmd, args and envs larger than %d bytes", agent.MaxArgBytes)
	}
	spec := agent.ProcessSpec{
		Argv: append([]string{cfg.Cmd}, cfg.Args...), Env: cfg.Envs, User: c.user,
		Stdin: m.Stdin == nil || *m.Stdin, TimeoutMs: c.startTimeoutMs, Tag: m.GetTag(),
	}
	if len(spec.Tag) > 256 {
		return invalidArg("tag longer than 256 bytes")
	}
	if cfg.Cwd != nil {
		cwd, err := resolvePath(*cfg.Cwd, c.user)
		if err != nil {
			return rpcError(err)
		}
		spec.Cwd = cwd
	}
	if pty := m.GetPty(); pty != nil {
		size := pty.GetSize()
		if size == nil || size.Cols == 0 || size.Rows == 0 || size.Cols > 65535 || size.Rows > 65535 {
			return invalidArg("pty size cols and rows must be 1..65535")
		}
		spec.PTY = &agent.PTY{Cols: uint16(size.Cols), Rows: uint16(size.Rows)}
	}
	// The SDK always runs "/bin/bash -l -c <cmd>"; templates without bash
	// (SPACE's busybox "minimal") get the POSIX shell instead.
	if cfg.Cmd == "/bin/bash" && !c.sb.HasBash.Load() {
		if _, err := c.sb.Agent.Stat(ctx, "/bin/bash"); client.IsNotFound(err) {
			spec.Argv[0] = "/bin/sh"
		} else if err == nil {
			c.sb.HasBash.Store(true)
		}
	}
	cmd, err := c.sb.Exec(ctx, spec)
	if err != nil {
		return rpcError(err)
	}
	return follow(ctx, c, cmd, func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.StartResponse{Event: ev})
	})
}

func (s *processService) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	c := callOf(ctx)
	cmd, err := find(c.sb, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	return follow(ctx, c, cmd, func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.ConnectResponse{Event: ev})
	})
}

// follow streams a command's events from its log: start first, then output
// as it arrives, end last; keepalives while idle. It replays the log from
// the beginning, so a late Connect still sees all output and the exit.
func follow(ctx context.Context, c *call, cmd *node.Command, send func(*pb.ProcessEvent) error) error {
	if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: uint32(cmd.Info.PID)}}}); err != nil {
		return err
	}
	rd, err := cmd.Log.NewReader(0)
	if err != nil {
		return connect.NewError(connect.CodeDataLoss, err)
	}
	keep := time.NewTimer(c.keepalive)
	defer keep.Stop()
	for {
		for !rd.Ready() {
			ch := rd.Wait()
			if ch == nil {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-keep.C:
				if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
					return err
				}
				keep.Reset(c.keepalive)
			case <-ch:
			}
		}
		rec, err := rd.Next(ctx)
		if err == io.EOF {
			// The log ended without an exit: the sandbox went away.
			return send(endEvent(&agent.Exit{Code: -1, Error: "sandbox stopped"}))
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// The log was closed under us: the sandbox is being destroyed.
			return send(endEvent(&agent.Exit{Code: -1, Error: "sandbox stopped"}))
		}
		keep.Reset(c.keepalive)
		switch rec.Type {
		case execlog.Stdout:
			data := append([]byte(nil), rec.Data...)
			out := &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stdout{Stdout: data}}
			if cmd.Info.PTY {
				out.Output = &pb.ProcessEvent_DataEvent_Pty{Pty: data}
			}
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: out}}); err != nil {
				return err
			}
		case execlog.Stderr:
			data := append([]byte(nil), rec.Data...)
			out := &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stderr{Stderr: data}}
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: out}}); err != nil {
				return err
			}
		case execlog.Exit:
			var ex agent.Exit
			if json.Unmarshal(rec.Data, &ex) != nil {
				ex = agent.Exit{Code: -1, Error: "malformed exit record"}
			}
			return send(endEvent(&ex))
		}
	}
}

// signalText is how Go's os.ProcessState names a signal death, which is
// what envd reports in status and error.
var signalText = map[string]string{
	"SIGKILL": "killed", "SIGTERM": "terminated", "SIGINT": "interrupt", "SIGHUP": "hangup",
	"SIGQUIT": "quit", "SIGABRT": "aborted", "SIGSEGV": "segmentation fault", "SIGPIPE": "broken pipe",
	"SIGUSR1": "user defined signal 1", "SIGUSR2": "user defined signal 2", "SIGALRM": "alarm clock",
}

func endEvent(ex *agent.Exit) *pb.ProcessEvent {
	end := &pb.ProcessEvent_EndEvent{ExitCode: int32(ex.Code), Exited: ex.Signal == ""}
	switch {
	case ex.Signal != "":
		name := signalText[ex.Signal]
		if name == "" {
			name = strings.ToLower(strings.TrimPrefix(ex.Signal, "SIG"))
		}
		end.ExitCode = -1
		end.Status = "signal: " + name
	case ex.Error != "" && ex.Code < 0:
		end.Status = ex.Error
	default:
		end.Status = fmt.Sprintf("exit status %d", ex.Code)
	}
	if ex.OOMKilled {
		end.Status += " (out of memory)"
	}
	if end.ExitCode != 0 || ex.Error != "" {
		msg := end.Status
		if ex.Error != "" && ex.Error != msg {
			msg = ex.Error
		}
		end.Error = &msg
	}
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}}
}

func (s *processService) List(ctx context.Context, req *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	c := callOf(ctx)
	out := &pb.ListResponse{}
	for _, cmd := range c.sb.Commands() {
		if cmd.Exit() != nil {
			continue // envd lists running processes only
		}
		cfg := &pb.ProcessConfig{Envs: map[string]string{}}
		if len(cmd.Info.Argv) > 0 {
			cfg.Cmd, cfg.Args = cmd.Info.Argv[0], cmd.Info.Argv[1:]
		}
		info := &pb.ProcessInfo{Config: cfg, Pid: uint32(cmd.Info.PID)}
		if cmd.Info.Tag != "" {
			tag := cmd.Info.Tag
			info.Tag = &tag
		}
		out.Processes = append(out.Processes, info)
	}
	return connect.NewResponse(out), nil
}

func (s *processService) SendInput(ctx context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	c := callOf(ctx)
	cmd, err := find(c.sb, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	in := req.Msg.GetInput()
	var data []byte
	switch v := in.GetInput().(type) {
	case *pb.ProcessInput_Stdin:
		data = v.Stdin
	case *pb.ProcessInput_Pty:
		data = v.Pty
	default:
		return nil, invalidArg("input.stdin or input.pty is required")
	}
	if err := c.sb.Agent.WriteStdin(ctx, cmd.Info.ID, data); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func (s *processService) CloseStdin(ctx context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	c := callOf(ctx)
	cmd, err := find(c.sb, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := c.sb.Agent.CloseStdin(ctx, cmd.Info.ID); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

func (s *processService) SendSignal(ctx context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	c := callOf(ctx)
	cmd, err := find(c.sb, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if cmd.Exit() != nil {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("process has exited"))
	}
	var sig string
	switch req.Msg.Signal {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = "SIGKILL"
	case pb.Signal_SIGNAL_SIGTERM:
		sig = "SIGTERM"
	default:
		return nil, invalidArg("signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM")
	}
	if err := c.sb.Agent.Signal(ctx, cmd.Info.ID, sig); err != nil {
		if client.IsConflict(err) {
			return nil, connect.NewError(connect.CodeNotFound, errors.New("process has exited"))
		}
		return nil, rpcError(err)
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

func (s *processService) Update(ctx context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	c := callOf(ctx)
	cmd, err := find(c.sb, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if pty := req.Msg.GetPty(); pty != nil {
		size := pty.GetSize()
		if size == nil || size.Cols == 0 || size.Rows == 0 || size.Cols > 65535 || size.Rows > 65535 {
			return nil, invalidArg("pty size cols and rows must be 1..65535")
		}
		if err := c.sb.Agent.Resize(ctx, cmd.Info.ID, uint16(size.Cols), uint16(size.Rows)); err != nil {
			return nil, rpcError(err)
		}
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}
