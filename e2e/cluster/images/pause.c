/* The pod sandbox's infra container: hold the namespaces, reap zombies, exit on a signal. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) { (void)sig; _exit(0); }
static void on_chld(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {}
}

int main(void) {
  struct sigaction term = {.sa_handler = on_term}, chld = {.sa_handler = on_chld};
  sigaction(SIGINT, &term, NULL);
  sigaction(SIGTERM, &term, NULL);
  chld.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &chld, NULL);
  for (;;) pause();
  return 1;
}
