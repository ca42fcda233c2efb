//go:build windows

package table

import (
	"os"

	"golang.org/x/sys/windows"
)

// BootID is not known on this system; identity relies on the PID alone.
func BootID() [16]byte { return [16]byte{} }

func bootHash([16]byte) uint64 { return 1 }

func readSelfIdentity() Identity { return Identity{PID: os.Getpid(), Boot: 1} }

// ProcessStart is not known on this system.
func ProcessStart(int) uint64 { return 0 }

func processAlive(pid int, _ uint64) bool {
	if pid <= 0 {
		return false
	}
	h, err := windows.OpenProcess(windows.PROCESS_QUERY_LIMITED_INFORMATION, false, uint32(pid))
	if err != nil {
		return err == windows.ERROR_ACCESS_DENIED
	}
	defer windows.CloseHandle(h)
	var code uint32
	if windows.GetExitCodeProcess(h, &code) != nil {
		return true
	}
	return code == 259 // STILL_ACTIVE
}
