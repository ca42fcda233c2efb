//go:build unix

package proctest

import (
	"bufio"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Group starts `sh -c 'sleep 60 & echo $!; read x'` in a process group of
// its own: the leader sh (its pid is the group's id) and a member sleep.
// endLeader makes the leader exit and waits for it; the member is killed
// by the test's cleanup. The co-owner tests of table and manager use it.
func Group(t testing.TB) (leader, member int, endLeader func()) {
	t.Helper()
	cmd := exec.Command("sh", "-c", "sleep 60 & echo $!; read x")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	leader = cmd.Process.Pid
	ended := false
	endLeader = func() {
		if !ended {
			ended = true
			in.Close()
			cmd.Wait()
		}
	}
	t.Cleanup(func() {
		syscall.Kill(-leader, syscall.SIGKILL)
		endLeader()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if member, err = strconv.Atoi(strings.TrimSpace(line)); err != nil {
		t.Fatal(err)
	}
	return leader, member, endLeader
}
