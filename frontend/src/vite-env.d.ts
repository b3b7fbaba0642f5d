// Vite's `?raw` imports: the file's text as a string (the example LIP the console uploads).
declare module "*?raw" {
  const content: string;
  export default content;
}
