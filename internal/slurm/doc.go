// Package slurm is gpucoord's understanding of Slurm: the host-list
// expressions Slurm uses to name sets of nodes, and the environment that
// srun gives each task of a job step. With the two together,
// `srun gpucoord launch` needs no flags: the step's node list says where
// the job runs and which nodes host the coordinators, and the task's node
// index and rank say which part this process plays.
//
// ExpandHostlist turns an expression such as "gpu[01-04],login1" into the
// names it stands for, in the order Slurm's `scontrol show hostnames` lists
// them. Detect reads a task's environment into an Env, or reports that the
// process is not a task of a Slurm step.
//
// Everything here is a pure function: the only input from outside is the
// environment, and that arrives through a getenv function (os.Getenv in
// production, a map in tests). Nothing reads files, runs scontrol or talks
// to slurmctld.
package slurm
