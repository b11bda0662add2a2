package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/agent/client"
	fspb "github.com/space-sandbox/space/internal/e2b/gen/filesystem"
	"github.com/space-sandbox/space/internal/e2b/gen/filesystem/filesystempbconnect"
)

// Bounds on directory walks (ListDir depth, watchers).
const (
	maxWalkEntries = 10000
	maxWalkDepth   = 16
	watchInterval  = 200 * time.Millisecond
	maxTotalWatch  = 4096
)

// filesystemService maps envd's filesystem service onto the agent's file
// calls. The agent has no inotify; watches poll the directory instead.
type filesystemService struct {
	filesystempbconnect.UnimplementedFilesystemHandler
	e *Envd
}

func entryOf(fi agent.FileInfo, p string) *fspb.EntryInfo {
	mode := os.FileMode(fi.Mode & 0o777)
	if fi.Mode&0o4000 != 0 {
		mode |= os.ModeSetuid
	}
	if fi.Mode&0o2000 != 0 {
		mode |= os.ModeSetgid
	}
	if fi.Mode&0o1000 != 0 {
		mode |= os.ModeSticky
	}
	e := &fspb.EntryInfo{Name: path.Base(p), Path: p, Size: fi.Size,
		ModifiedTime: timestamppb.New(time.Unix(fi.ModTime, 0)), Metadata: map[string]string{}}
	switch fi.Type {
	case "file":
		e.Type = fspb.FileType_FILE_TYPE_FILE
	case "dir":
		e.Type = fspb.FileType_FILE_TYPE_DIRECTORY
		mode |= os.ModeDir
	case "symlink":
		e.Type = fspb.FileType_FILE_TYPE_SYMLINK
		mode |= os.ModeSymlink
		t := fi.Target
		e.SymlinkTarget = &t
	}
	e.Mode, e.Permissions = uint32(mode), mode.String()
	return e
}

// files is the sandbox's agent acting as the call's user (envd's Basic
// auth user; "" = the sandbox's default user), with that user's
// permissions, as envd does.
func (c *call) files() *client.Client { return c.sb.Agent.As(c.user) }

func (s *filesystemService) path(ctx context.Context, p string) (*call, string, error) {
	c := callOf(ctx)
	abs, err := resolvePath(p, c.user)
	if err != nil {
		return nil, "", rpcError(err)
	}
	return c, abs, nil
}

func (s *filesystemService) stat(ctx context.Context, ag *client.Client, p string) (*fspb.EntryInfo, error) {
	fi, err := ag.Stat(ctx, p)
	if err != nil {
		return nil, rpcError(err)
	}
	return entryOf(fi, p), nil
}

func (s *filesystemService) Stat(ctx context.Context, req *connect.Request[fspb.StatRequest]) (*connect.Response[fspb.StatResponse], error) {
	c, p, err := s.path(ctx, req.Msg.Path)
	if err != nil {
		return nil, err
	}
	e, err := s.stat(ctx, c.files(), p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&fspb.StatResponse{Entry: e}), nil
}

func (s *filesystemService) MakeDir(ctx context.Context, req *connect.Request[fspb.MakeDirRequest]) (*connect.Response[fspb.MakeDirResponse], error) {
	c, p, err := s.path(ctx, req.Msg.Path)
	if err != nil {
		return nil, err
	}
	// envd says already_exists (the SDK returns false); the agent's mkdir -p
	// would succeed silently, so look first.
	if fi, err := c.files().Stat(ctx, p); err == nil {
		if fi.Type == "dir" {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %s already exists", p))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %s exists and is not a directory", p))
	} else if !client.IsNotFound(err) {
		return nil, rpcError(err)
	}
	if err := c.files().Mkdir(ctx, p); err != nil {
		return nil, rpcError(err)
	}
	e, err := s.stat(ctx, c.files(), p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&fspb.MakeDirResponse{Entry: e}), nil
}

func (s *filesystemService) Move(ctx context.Context, req *connect.Request[fspb.MoveRequest]) (*connect.Response[fspb.MoveResponse], error) {
	c, from, err := s.path(ctx, req.Msg.Source)
	if err != nil {
		return nil, err
	}
	_, to, err := s.path(ctx, req.Msg.Destination)
	if err != nil {
		return nil, err
	}
	if err := c.files().Move(ctx, from, to); err != nil {
		return nil, rpcError(err)
	}
	e, err := s.stat(ctx, c.files(), to)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&fspb.MoveResponse{Entry: e}), nil
}

func (s *filesystemService) Remove(ctx context.Context, req *connect.Request[fspb.RemoveRequest]) (*connect.Response[fspb.RemoveResponse], error) {
	c, p, err := s.path(ctx, req.Msg.Path)
	if err != nil {
		return nil, err
	}
	if p == "/" {
		return nil, invalidArg("refusing to remove /")
	}
	if err := c.files().Remove(ctx, p, true); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&fspb.RemoveResponse{}), nil
}

// walk lists root down to depth levels (1 = its entries only), bounded.
func walk(ctx context.Context, ag *client.Client, root string, depth int, fn func(p string, fi agent.FileInfo)) error {
	type dir struct {
		p     string
		level int
	}
	queue := []dir{{root, 1}}
	n := 0
	for len(queue) > 0 {
		d := queue[0]
		queue = queue[1:]
		list, err := ag.ListDir(ctx, d.p)
		if err != nil {
			if d.p != root && client.IsNotFound(err) {
				continue // removed while walking
			}
			return err
		}
		for _, fi := range list {
			if n++; n > maxWalkEntries {
				return nil
			}
			p := path.Join(d.p, fi.Name)
			fn(p, fi)
			if fi.Type == "dir" && d.level < depth {
				queue = append(queue, dir{p, d.level + 1})
			}
		}
	}
	return nil
}

func (s *filesystemService) ListDir(ctx context.Context, req *connect.Request[fspb.ListDirRequest]) (*connect.Response[fspb.ListDirResponse], error) {
	c, p, err := s.path(ctx, req.Msg.Path)
	if err != nil {
		return nil, err
	}
	depth := int(min(max(req.Msg.Depth, 1), maxWalkDepth))
	fi, err := c.files().Stat(ctx, p)
	if err != nil {
		return nil, rpcError(err)
	}
	if fi.Type != "dir" {
		return nil, invalidArg("path %s is not a directory", p)
	}
	out := &fspb.ListDirResponse{}
	err = walk(ctx, c.files(), p, depth, func(ep string, fi agent.FileInfo) {
		if fi.Type != "other" {
			out.Entries = append(out.Entries, entryOf(fi, ep))
		}
	})
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(out), nil
}

// fileState is what a poll compares.
type fileState struct {
	info agent.FileInfo
	path string
}

type snapshot map[string]fileState // name relative to the watched dir

func scan(ctx context.Context, ag *client.Client, root string, recursive bool) (snapshot, error) {
	depth := 1
	if recursive {
		depth = maxWalkDepth
	}
	snap := snapshot{}
	err := walk(ctx, ag, root, depth, func(p string, fi agent.FileInfo) {
		// The agent writes uploads to a temporary file and renames it.
		if strings.HasPrefix(fi.Name, ".space-upload-") {
			return
		}
		snap[strings.TrimPrefix(p, strings.TrimSuffix(root, "/")+"/")] = fileState{info: fi, path: p}
	})
	return snap, err
}

// diff turns two polls into inotify-like events: a new file is CREATE (and
// WRITE when it has content), a changed one WRITE or CHMOD, a gone one REMOVE.
func diff(old, cur snapshot, withEntry bool) []*fspb.FilesystemEvent {
	var out []*fspb.FilesystemEvent
	ev := func(name string, t fspb.EventType, st *fileState) {
		e := &fspb.FilesystemEvent{Name: name, Type: t}
		if withEntry && st != nil {
			e.Entry = entryOf(st.info, st.path)
		}
		out = append(out, e)
	}
	names := make([]string, 0, len(cur))
	for n := range cur {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		st := cur[n]
		was, ok := old[n]
		switch {
		case !ok:
			ev(n, fspb.EventType_EVENT_TYPE_CREATE, &st)
			if st.info.Type == "file" && st.info.Size > 0 {
				ev(n, fspb.EventType_EVENT_TYPE_WRITE, &st)
			}
		case was.info.Type != st.info.Type:
			ev(n, fspb.EventType_EVENT_TYPE_REMOVE, nil)
			ev(n, fspb.EventType_EVENT_TYPE_CREATE, &st)
		case was.info.Size != st.info.Size || was.info.ModTime != st.info.ModTime:
			ev(n, fspb.EventType_EVENT_TYPE_WRITE, &st)
		case was.info.Mode != st.info.Mode:
			ev(n, fspb.EventType_EVENT_TYPE_CHMOD, &st)
		}
	}
	gone := []string{}
	for n := range old {
		if _, ok := cur[n]; !ok {
			gone = append(gone, n)
		}
	}
	sort.Strings(gone)
	for _, n := range gone {
		ev(n, fspb.EventType_EVENT_TYPE_REMOVE, nil)
	}
	return out
}

func (s *filesystemService) watchRoot(ctx context.Context, p string) (*call, string, error) {
	c, root, err := s.path(ctx, p)
	if err != nil {
		return nil, "", err
	}
	fi, err := c.files().Stat(ctx, root)
	if err != nil {
		return nil, "", rpcError(err)
	}
	if fi.Type != "dir" {
		return nil, "", invalidArg("path %s is not a directory", root)
	}
	return c, root, nil
}

func (s *filesystemService) WatchDir(ctx context.Context, req *connect.Request[fspb.WatchDirRequest], stream *connect.ServerStream[fspb.WatchDirResponse]) error {
	c, root, err := s.watchRoot(ctx, req.Msg.Path)
	if err != nil {
		return err
	}
	snap, err := scan(ctx, c.files(), root, req.Msg.Recursive)
	if err != nil {
		return rpcError(err)
	}
	if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Start{Start: &fspb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	tick := time.NewTicker(watchInterval)
	defer tick.Stop()
	idle := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		cur, err := scan(ctx, c.files(), root, req.Msg.Recursive)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !client.IsNotFound(err) {
				return rpcError(err)
			}
			cur = snapshot{} // the watched directory is gone
		}
		evs := diff(snap, cur, req.Msg.IncludeEntry)
		snap = cur
		for _, ev := range evs {
			if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
				return err
			}
		}
		if idle += watchInterval; len(evs) > 0 {
			idle = 0
		} else if idle >= c.keepalive {
			idle = 0
			if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Keepalive{Keepalive: &fspb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		}
	}
}

// watcher is a polling watcher of CreateWatcher/GetWatcherEvents.
type watcher struct {
	sandbox   string
	user      string // the creator's: polls act as it
	root      string
	recursive bool
	entry     bool
	snap      snapshot
	used      time.Time
}

func (s *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[fspb.CreateWatcherRequest]) (*connect.Response[fspb.CreateWatcherResponse], error) {
	c, root, err := s.watchRoot(ctx, req.Msg.Path)
	if err != nil {
		return nil, err
	}
	snap, err := scan(ctx, c.files(), root, req.Msg.Recursive)
	if err != nil {
		return nil, rpcError(err)
	}
	b := make([]byte, 12)
	rand.Read(b)
	id := hex.EncodeToString(b)
	e := s.e
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for wid, w := range e.watchers {
		if time.Since(w.used) > watcherIdleTTL {
			delete(e.watchers, wid)
		} else if w.sandbox == c.sb.ID {
			n++
		}
	}
	if n >= maxWatchers || len(e.watchers) >= maxTotalWatch {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("at most %d watchers per sandbox", maxWatchers))
	}
	e.watchers[id] = &watcher{sandbox: c.sb.ID, user: c.user, root: root, recursive: req.Msg.Recursive, entry: req.Msg.IncludeEntry, snap: snap, used: time.Now()}
	return connect.NewResponse(&fspb.CreateWatcherResponse{WatcherId: id}), nil
}

func (s *filesystemService) watcher(ctx context.Context, id string) (*call, *watcher, error) {
	c := callOf(ctx)
	s.e.mu.Lock()
	w := s.e.watchers[id]
	s.e.mu.Unlock()
	if w == nil || w.sandbox != c.sb.ID {
		return nil, nil, connect.NewError(connect.CodeNotFound, errors.New("watcher not found"))
	}
	return c, w, nil
}

func (s *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[fspb.GetWatcherEventsRequest]) (*connect.Response[fspb.GetWatcherEventsResponse], error) {
	c, w, err := s.watcher(ctx, req.Msg.WatcherId)
	if err != nil {
		return nil, err
	}
	cur, err := scan(ctx, c.sb.Agent.As(w.user), w.root, w.recursive)
	if err != nil && !client.IsNotFound(err) {
		return nil, rpcError(err)
	}
	s.e.mu.Lock()
	evs := diff(w.snap, cur, w.entry)
	w.snap, w.used = cur, time.Now()
	s.e.mu.Unlock()
	return connect.NewResponse(&fspb.GetWatcherEventsResponse{Events: evs}), nil
}

func (s *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[fspb.RemoveWatcherRequest]) (*connect.Response[fspb.RemoveWatcherResponse], error) {
	if _, _, err := s.watcher(ctx, req.Msg.WatcherId); err != nil {
		return nil, err
	}
	s.e.mu.Lock()
	delete(s.e.watchers, req.Msg.WatcherId)
	s.e.mu.Unlock()
	return connect.NewResponse(&fspb.RemoveWatcherResponse{}), nil
}
