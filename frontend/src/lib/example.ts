// "Try an example": the console carries one example LIP from examples/ and uploads it as a
// program of the tenant. Its docstring's `Example args: {...}` line becomes the program's
// default arguments on the server (api/services/programs.py), so its run form opens filled in.
import completionSource from "../../../examples/completion.py?raw";
import { ApiError } from "../api/errors";
import { listPrograms, uploadProgram } from "../api/endpoints";
import type { Program } from "../api/types";

export const EXAMPLE = {
  file: "completion.py",
  name: "completion-example",
  description: "Greedy completion, the smallest useful LIP (examples/completion.py)",
  source: completionSource,
};

/** Upload the example (or find it, when this tenant has it already) and return its program. */
export async function uploadExample(): Promise<Program> {
  const file = new File([EXAMPLE.source], EXAMPLE.file, { type: "text/x-python" });
  try {
    return await uploadProgram(file, EXAMPLE.name, EXAMPLE.description);
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 409)) throw err;
    const existing = (await listPrograms()).find((p) => p.name === EXAMPLE.name);
    if (!existing) throw err;
    return existing;
  }
}
