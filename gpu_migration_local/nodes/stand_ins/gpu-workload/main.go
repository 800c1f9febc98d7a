// A GPU workload image's userland, one binary installed under several names (the image puts it at /gpu-workload,
// /bin/sh, /bin/sleep and /usr/bin/nvidia-smi):
//   - gpu-workload: prints the GPUs its container was given (NVIDIA_VISIBLE_DEVICES, set by the device plugin's
//     Allocate or by the CDI device the runtime injected) and runs until stopped;
//   - nvidia-smi -L: lists those GPUs as nvidia-smi does ("GPU <i>: <name> (UUID: <uuid>)"), the name being the
//     local environment's default GPU (gpu_doubles.py: NVIDIA L4), as the NVIDIA container toolkit's nvidia-smi
//     would show the GPUs the container was given;
//   - sleep N, and sh -c "<command> && <command> ...": what smoke-test commands such as
//     `sh -c "nvidia-smi -L && sleep 3"` (Pulumi.local.yaml) need, and nothing more.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func visible() []string {
	v := os.Getenv("NVIDIA_VISIBLE_DEVICES")
	if v == "" || v == "void" || v == "none" {
		return nil
	}
	return strings.Split(v, ",")
}

func run(args []string) int {
	switch filepath.Base(args[0]) {
	case "nvidia-smi":
		gpus := visible()
		if len(gpus) == 0 {
			fmt.Fprintln(os.Stderr, "No devices were found")
			return 6
		}
		for i, u := range gpus {
			fmt.Printf("GPU %d: NVIDIA L4 (UUID: %s)\n", i, u)
		}
		return 0
	case "sleep":
		if len(args) < 2 {
			return 1
		}
		s, err := strconv.ParseFloat(args[1], 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "sleep: invalid time interval %q\n", args[1])
			return 1
		}
		time.Sleep(time.Duration(s * float64(time.Second)))
		return 0
	case "sh":
		if len(args) < 3 || args[1] != "-c" {
			fmt.Fprintln(os.Stderr, "sh: only -c \"<command> && ...\" is supported")
			return 2
		}
		for _, part := range strings.Split(args[2], "&&") {
			if rc := run(strings.Fields(part)); rc != 0 {
				return rc
			}
		}
		return 0
	case "gpu-workload":
		fmt.Printf("NVIDIA_VISIBLE_DEVICES=%s\n", os.Getenv("NVIDIA_VISIBLE_DEVICES"))
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
		<-stop
		return 0
	}
	fmt.Fprintf(os.Stderr, "%s: command not found\n", args[0])
	return 127
}

func main() { os.Exit(run(os.Args)) }
