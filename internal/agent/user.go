package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// maxEtcFile bounds how much of /etc/passwd and /etc/group is read; the
// sandbox owns those files and may make them huge.
const maxEtcFile = 8 << 20

// maxUserName bounds user names in requests.
const maxUserName = 256

var errUnknownUser = errors.New("agent: unknown user")

// account is a resolved user.
type account struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32 // supplementary groups, primary included
	Home   string
}

// lookupUser resolves a user name or numeric uid from the passwd and group
// files in etcDir (the sandbox's own /etc). A numeric uid without a passwd
// entry gets gid 0 and home "/", as Docker does.
func lookupUser(etcDir, user string) (account, error) {
	if user == "" || len(user) > maxUserName || strings.ContainsAny(user, ":\n\x00") {
		return account{}, fmt.Errorf("%w: invalid user name", errUnknownUser)
	}
	numeric, numErr := strconv.ParseUint(user, 10, 32)
	isNumeric := numErr == nil

	passwd, err := readEtc(filepath.Join(etcDir, "passwd"))
	if err != nil && !isNumeric {
		return account{}, fmt.Errorf("%w: %q: %w", errUnknownUser, user, err)
	}
	acct, found := findPasswd(passwd, user, isNumeric, uint32(numeric))
	if !found {
		if !isNumeric {
			return account{}, fmt.Errorf("%w: %q", errUnknownUser, user)
		}
		acct = account{Name: user, UID: uint32(numeric), GID: 0, Home: "/"}
		if acct.UID == 0 {
			acct.Name, acct.Home = "root", "/root"
		}
	}
	acct.Groups = []uint32{acct.GID}
	if group, err := readEtc(filepath.Join(etcDir, "group")); err == nil {
		acct.Groups = appendGroups(acct.Groups, group, acct.Name)
	}
	return acct, nil
}

func readEtc(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxEtcFile))
}

// findPasswd scans passwd lines "name:pw:uid:gid:gecos:home:shell".
func findPasswd(data []byte, user string, byUID bool, uid uint32) (account, bool) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) < 7 {
			continue
		}
		u, err1 := strconv.ParseUint(f[2], 10, 32)
		g, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		if (byUID && uint32(u) == uid) || (!byUID && f[0] == user) {
			home := f[5]
			if !filepath.IsAbs(home) {
				home = "/"
			}
			return account{Name: f[0], UID: uint32(u), GID: uint32(g), Home: home}, true
		}
	}
	return account{}, false
}

// appendGroups adds the gids of group lines "name:pw:gid:member,member" that
// list user as a member.
func appendGroups(groups []uint32, data []byte, user string) []uint32 {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) < 4 || f[3] == "" {
			continue
		}
		gid, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil {
			continue
		}
		for _, m := range strings.Split(f[3], ",") {
			if m == user && !containsGID(groups, uint32(gid)) && len(groups) < 256 {
				groups = append(groups, uint32(gid))
				break
			}
		}
	}
	return groups
}

func containsGID(gs []uint32, g uint32) bool {
	for _, x := range gs {
		if x == g {
			return true
		}
	}
	return false
}
